// The prefill path of Q8_0/Q4_0 experts (expert_ffn.cu says how it works): per active expert a
// grouped GEMM on the int8 tensor cores (mma.sync m16n8k32, s8 x s8 -> s32).
//
// The arithmetic is the decode path's and the CPU executor's: activations quantized to 8 bits
// per 32-block (QuantizeRowsKernel, bit for bit the CPU's quantizer), each 32-block's dot of
// weight codes and activation quants exact in int32 (one MMA's k is one block), then
// (float)dot * d_w * d_x summed in fp32. Only the order of those fp32 sums differs from the
// decode kernels, so the prefill path is held to the decode path's tolerance.
//
// Exact int32 -> float for free: each MMA starts its accumulators at kBiasBits, the bits of the
// float 1.5 * 2^23, so that the int32 result read as a float is exactly 1.5 * 2^23 + dot (a
// block's |dot| <= 32 * 127 * 128 < 2^22 keeps it in [2^23, 2^24), where floats are integers);
// subtracting the bias is exact. This replaces a conversion instruction (a quarter-rate unit)
// per output by a full-rate subtraction.
#pragma once

#include "kernels/cuda/expert_ffn_common.cuh"

namespace moetier::cuda::expert_ffn {

constexpr int kI8M = 32;         // assignments a block: two 16-row MMA tiles
constexpr int kI8Threads = 128;  // 4 warps side by side along the weight rows
constexpr int kI8Warps = kI8Threads / kWarp;
constexpr int kI8StageBlocks = 8;  // 32-column blocks staged at once (256 columns)
constexpr int kI8BRows = 128;      // weight rows staged a block, over its matrices
// Shared-memory pitch of a staged activation row: 256 quants + 16, so that the eight rows a
// fragment load touches start 4 banks apart (68 words a row).
constexpr int kI8APitch = kI8StageBlocks * kQBlock + 16;
constexpr int kBiasBits = 0x4B400000;  // 1.5 * 2^23 as a float's bits (the header says why)
constexpr float kBiasValue = 12582912.0f;

// Bytes of one staged weight row: kI8StageBlocks blocks as they lie in the matrix (144 Q4_0,
// 272 Q8_0: 36 and 68 words, which also puts a fragment's eight rows 4 banks apart).
template <Fmt F>
constexpr int kI8BPitch = kI8StageBlocks*(F == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes);

template <Fmt F>
constexpr int Int8GemmSmemBytes() {
  return kI8M * kI8APitch + kI8M * kI8StageBlocks * 4 + kI8BRows * kI8BPitch<F>;
}

struct Int8GemmArgs {
  const int32_t* n_active;
  const int32_t* experts;
  const int32_t* begin;
  const int32_t* token_of;  // as DecodeArgs: the activation row of assignment j, or j if null
  const ExpertPointers* table;
  int64_t rows = 0;
  int64_t cols = 0;
  const int8_t* act_q = nullptr;  // [*, q_stride] quantized activations (q_stride % 16 == 0)
  const float* act_d = nullptr;   // [*, cols / 32] their scales
  int64_t q_stride = 0;
  float* out = nullptr;  // [n_assignments, rows]
};

__device__ __forceinline__ uint32_t LoadShared32(const unsigned char* p) {  // p 2-byte aligned
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

// The B fragment of one block of a staged weight row: b[0] = codes 4t..4t+3, b[1] = codes
// 16+4t..16+4t+3 (t = lane % 4), as signed bytes.
template <Fmt F>
__device__ __forceinline__ void WeightFragment(const unsigned char* blk, int t, uint32_t (&b)[2]) {
  const unsigned char* qs = blk + 2;
  if constexpr (F == Fmt::kQ8_0) {
    b[0] = LoadShared32(qs + 4 * t);
    b[1] = LoadShared32(qs + 16 + 4 * t);
  } else {  // byte i: code i (low nibble) and code i + 16 (high nibble), offset by 8
    const uint32_t v = LoadShared32(qs + 4 * t);
    b[0] = __vsub4(v & 0x0F0F0F0Fu, 0x08080808u);
    b[1] = __vsub4((v >> 4) & 0x0F0F0F0Fu, 0x08080808u);
  }
}

// c += a (16x32, row) x b (32x8, col) on int8 tensor cores, c starting at the bias.
__device__ __forceinline__ void MmaInt8(const uint32_t (&a)[4], const uint32_t (&b)[2],
                                        float (&c)[4]) {
  int32_t r[4];
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(kBiasBits));
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = __int_as_float(r[i]) - kBiasValue;
}

// Stages blocks [b0, b0 + nb) of the tile's activation rows and of its weight rows into shared
// memory: 16-byte cp.async where the bytes allow (activation rows always; weight rows when each
// matrix's rows start 16-byte aligned and the range is whole 16-byte words), 2-byte copies
// otherwise. Rows of `a_src` < 0 (past the expert's assignments) and weight rows past the
// matrix are not touched: their products are never written. The caller waits and syncs.
template <Fmt F, int kMats>
__device__ __forceinline__ void StageInt8(const Int8GemmArgs& p, const int32_t* a_src,
                                          const unsigned char* const (&mat)[kMats], int64_t n0,
                                          int64_t b0, int nb, bool aligned, unsigned char* sa,
                                          float* sad, unsigned char* sb) {
  constexpr int kBB = F == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes;
  constexpr int kNPerMat = kI8BRows / kMats;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t n_blocks = p.cols / kQBlock;
  const int a_words = nb * kQBlock / 16;
  for (int i = tid; i < kI8M * a_words; i += kI8Threads) {
    const int row = i / a_words, w = i % a_words;
    if (a_src[row] >= 0)
      CpAsync16(sa + row * kI8APitch + w * 16,
                p.act_q + int64_t{a_src[row]} * p.q_stride + b0 * kQBlock + w * 16);
  }
  for (int i = tid; i < kI8M * nb; i += kI8Threads) {
    const int row = i / nb, b = i % nb;
    if (a_src[row] >= 0) sad[row * kI8StageBlocks + b] = p.act_d[a_src[row] * n_blocks + b0 + b];
  }
  const int64_t row_bytes = n_blocks * kBB;
  const int bytes = nb * kBB;
  const int pieces = aligned && bytes % 16 == 0 ? bytes / 16 : bytes / 2;
  const int piece_bytes = aligned && bytes % 16 == 0 ? 16 : 2;
  for (int i = tid; i < kI8BRows * pieces; i += kI8Threads) {
    const int srow = i / pieces, piece = i % pieces;
    const int64_t n = n0 + srow % kNPerMat;
    if (n >= p.rows) continue;
    const unsigned char* base = srow < kNPerMat ? mat[0] : mat[kMats - 1];
    const unsigned char* src = base + n * row_bytes + b0 * kBB + piece * piece_bytes;
    unsigned char* dst = sb + srow * kI8BPitch<F> + piece * piece_bytes;
    if (piece_bytes == 16) {
      CpAsync16(dst, src);
    } else {
      *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src);
    }
  }
  CpAsyncCommit();
}

// As GemmKernel, on int8 tensor cores: the assignments [blockIdx.y * 32, +32) of active expert
// blockIdx.z against rows [blockIdx.x * N, +N) of its kMats matrices, N = 128 / kMats. Warp w
// takes all 32 assignments and rows [w * N / 4, +N / 4) of each matrix: per 32-column block,
// 2 x (N / 32) MMAs of each matrix sharing the warp's A fragments.
template <Fmt F, int kMats>
__global__ void __launch_bounds__(kI8Threads) Int8GemmKernel(Int8GemmArgs p) {
  constexpr int kBB = F == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes;
  constexpr int kNPerMat = kI8BRows / kMats;   // rows of each matrix a block
  constexpr int kWarpN = kNPerMat / kI8Warps;  // rows of each matrix a warp
  constexpr int kJ = kWarpN / 8;               // 8-row MMA tiles of each matrix a warp
  PdlWait();
  GemmTile tile;
  if (!BlockTile(p, kI8M, kNPerMat, &tile)) return;
  const int32_t first = tile.first;
  const int n_assign = tile.n_assign, m0 = tile.m0;
  const int64_t n0 = tile.n0;
  const unsigned char* mat[kMats];
  mat[0] = static_cast<const unsigned char*>(kMats == 2 ? tile.e.gate : tile.e.down);
  if constexpr (kMats == 2) mat[1] = static_cast<const unsigned char*>(tile.e.up);

  __shared__ __align__(16) unsigned char smem[Int8GemmSmemBytes<F>()];
  __shared__ int32_t a_src[kI8M];  // activation row of each tile row, -1 past the assignments
  unsigned char* sa = smem;        // [32][kI8APitch] int8
  auto* sad = reinterpret_cast<float*>(smem + kI8M * kI8APitch);            // [32][8] scales
  unsigned char* sb = smem + kI8M * kI8APitch + kI8M * kI8StageBlocks * 4;  // [128][pitch]
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kI8M) {
    const int j = first + m0 + tid;
    a_src[tid] = m0 + tid >= n_assign ? -1 : p.token_of != nullptr ? p.token_of[j] : j;
  }
  const int64_t row_bytes = FmtBytes(F, p.cols);
  bool aligned = row_bytes % 16 == 0;
#pragma unroll
  for (int m = 0; m < kMats; ++m)
    aligned = aligned && reinterpret_cast<uintptr_t>(mat[m]) % 16 == 0;
  __syncthreads();

  const int warp = tid / kWarp, lane = tid % kWarp;
  const int g = lane / 4, t = lane % 4;  // the MMA fragments' row group and thread in group
  float acc[kMats][2][kJ][4];
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int j = 0; j < kJ; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][mt][j][i] = 0.0f;

  const int64_t n_blocks = p.cols / kQBlock;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kI8StageBlocks) {
    const int nb =
        static_cast<int>(n_blocks - b0 < kI8StageBlocks ? n_blocks - b0 : kI8StageBlocks);
    StageInt8<F, kMats>(p, a_src, mat, n0, b0, nb, aligned, sa, sad, sb);
    CpAsyncWait<0>();
    __syncthreads();
    for (int kb = 0; kb < nb; ++kb) {
      uint32_t fa[2][4];
      float dx[2][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const unsigned char* r = sa + (mt * 16 + g) * kI8APitch + kb * kQBlock + 4 * t;
        fa[mt][0] = *reinterpret_cast<const uint32_t*>(r);
        fa[mt][1] = *reinterpret_cast<const uint32_t*>(r + 8 * kI8APitch);
        fa[mt][2] = *reinterpret_cast<const uint32_t*>(r + 16);
        fa[mt][3] = *reinterpret_cast<const uint32_t*>(r + 8 * kI8APitch + 16);
        dx[mt][0] = sad[(mt * 16 + g) * kI8StageBlocks + kb];
        dx[mt][1] = sad[(mt * 16 + g + 8) * kI8StageBlocks + kb];
      }
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          const int srow = m * kNPerMat + warp * kWarpN + j * 8;  // the tile's first row
          uint32_t fb[2];
          WeightFragment<F>(sb + (srow + g) * kI8BPitch<F> + kb * kBB, t, fb);
          // The scales of this thread's two output columns: rows srow + 2t and + 1.
          const unsigned char* s0 = sb + (srow + 2 * t) * kI8BPitch<F> + kb * kBB;
          const float dw0 = F16BitsToFloat(*reinterpret_cast<const uint16_t*>(s0));
          const float dw1 = F16BitsToFloat(*reinterpret_cast<const uint16_t*>(s0 + kI8BPitch<F>));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float dot[4];
            MmaInt8(fa[mt], fb, dot);
            float(&c)[4] = acc[m][mt][j];
            c[0] = fmaf(dot[0], dx[mt][0] * dw0, c[0]);
            c[1] = fmaf(dot[1], dx[mt][0] * dw1, c[1]);
            c[2] = fmaf(dot[2], dx[mt][1] * dw0, c[2]);
            c[3] = fmaf(dot[3], dx[mt][1] * dw1, c[3]);
          }
        }
    }
    __syncthreads();  // the stage is refilled next
  }

  // C fragment: c[0], c[1] at (row g, columns 2t, 2t + 1), c[2], c[3] at row g + 8.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = mt * 16 + g + (i >= 2 ? 8 : 0);
        const int64_t n = n0 + warp * kWarpN + j * 8 + 2 * t + (i & 1);
        if (m0 + row >= n_assign || n >= p.rows) continue;
        float v = acc[0][mt][j][i];
        if constexpr (kMats == 2) v = Silu(v) * acc[1][mt][j][i];
        p.out[static_cast<int64_t>(first + m0 + row) * p.rows + n] = v;
      }
}

}  // namespace moetier::cuda::expert_ffn
