// The decode kernels of DenseMatMul (dense.cu says how they work): one warp per weight row (or
// a few), the float formats streamed with 16-byte loads, Q8_0/Q4_0 rows staged in shared memory
// and dotted with int8 activations; the products of one x listed for one launch (MatrixList).
// Included by dense.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda::dense_decode {

constexpr int kDecodeWarps = 8;  // warps (rows) per block of the decode kernels
constexpr int kDecodeThreads = kDecodeWarps * kWarp;
constexpr int kFloatUnroll = 4;         // 16-byte row loads a lane keeps in flight (float formats)
constexpr int kQuantBlocksPerLane = 2;  // Q8_0/Q4_0 blocks a lane takes per staged chunk

__device__ __forceinline__ uint16_t LoadU16(const uint8_t* p) {  // p 2-byte aligned
  return *reinterpret_cast<const uint16_t*>(p);
}

// ---- float formats -----------------------------------------------------------------------

// Up to kMaxListed matrices of one dtype and width that multiply the same x (q, k and v), their
// rows taken as one list by one launch: each matrix's rows padded to a multiple of `pad` (the
// rows a warp takes), so that a warp's rows lie in one matrix.
constexpr int kMaxListed = 4;
struct MatrixList {
  const uint8_t* w[kMaxListed];
  float* y[kMaxListed];
  int64_t rows[kMaxListed];
  int n = 0;
};

__host__ __device__ __forceinline__ int64_t PaddedRows(int64_t rows, int64_t pad) {
  return (rows + pad - 1) / pad * pad;
}

__host__ __device__ __forceinline__ int64_t ListedRows(const MatrixList& p, int64_t pad) {
  int64_t total = 0;
  for (int m = 0; m < kMaxListed; ++m)  // unrolled on the device: constant indices (see Locate)
    if (m < p.n) total += PaddedRows(p.rows[m], pad);
  return total;
}

// Row g of the padded list: the matrix it lies in, and its row there.
struct ListedRow {
  const uint8_t* w = nullptr;
  float* y = nullptr;
  int64_t rows = 0;  // the matrix's
  int64_t r = 0;
};

// Finds row g of the padded list in *out; false past the list's end. The list is read only at
// constant indices (an unrolled loop of selects): indexing a kernel parameter by a runtime value
// makes the compiler copy it to a per-thread stack frame, and those stores cost a short-lived
// warp about as much memory traffic as its weight row (with such a frame the one-token bf16
// products reach half the bandwidth they do without it). ptxas -v shows any frame.
__device__ __forceinline__ bool Locate(const MatrixList& p, int64_t g, int64_t pad,
                                       ListedRow* out) {
  bool found = false;
#pragma unroll
  for (int i = 0; i < kMaxListed; ++i) {
    const int64_t n = i < p.n ? PaddedRows(p.rows[i], pad) : 0;
    if (!found && g < n) {
      *out = ListedRow{p.w[i], p.y[i], p.rows[i], g};
      found = true;
    }
    if (!found) g -= n;
  }
  return found;
}

template <DType kD>
constexpr int kElemBytes = kD == DType::kF32 ? 4 : 2;

// The bytes of 8 consecutive weights: 32 for f32 (lo, hi), 16 for f16/bf16 (lo).
struct Raw8 {
  uint4 lo;
  uint4 hi;
};

template <DType kD>
__device__ __forceinline__ Raw8 LoadRaw8(const uint8_t* row, int64_t c) {
  Raw8 r;
  const auto* p = reinterpret_cast<const uint4*>(row + c * kElemBytes<kD>);
  r.lo = __ldg(p);
  if constexpr (kD == DType::kF32) {
    r.hi = __ldg(p + 1);
  } else {
    r.hi = make_uint4(0, 0, 0, 0);
  }
  return r;
}

template <DType kD>
__device__ __forceinline__ float HalfBits(uint32_t bits) {
  if constexpr (kD == DType::kBF16) {
    return Bf16BitsToFloat(static_cast<uint16_t>(bits));
  } else {
    return F16BitsToFloat(static_cast<uint16_t>(bits));
  }
}

template <DType kD>
__device__ __forceinline__ void Decode8(const Raw8& r, float (&w)[8]) {
  if constexpr (kD == DType::kF32) {
    w[0] = __uint_as_float(r.lo.x);
    w[1] = __uint_as_float(r.lo.y);
    w[2] = __uint_as_float(r.lo.z);
    w[3] = __uint_as_float(r.lo.w);
    w[4] = __uint_as_float(r.hi.x);
    w[5] = __uint_as_float(r.hi.y);
    w[6] = __uint_as_float(r.hi.z);
    w[7] = __uint_as_float(r.hi.w);
  } else {
    const uint32_t words[4] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = HalfBits<kD>(words[k] & 0xffffu);
      w[2 * k + 1] = HalfBits<kD>(words[k] >> 16);
    }
  }
}

template <DType kD>
__device__ __forceinline__ float WeightAt(const uint8_t* row, int64_t c) {
  if constexpr (kD == DType::kF32) {
    return reinterpret_cast<const float*>(row)[c];
  } else {
    return HalfBits<kD>(reinterpret_cast<const uint16_t*>(row)[c]);
  }
}

// Lane 0 writes the warp's sums of acc[0, n) to y[t * rows + r], t < n.
template <int kTok>
__device__ __forceinline__ void WriteRow(float (&acc)[kTok], int n, int lane, float* y,
                                         int64_t rows, int64_t r) {
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    if (t < n) {  // warp-uniform
      const float s = WarpSum(acc[t]);
      if (lane == 0) y[t * rows + r] = s;
    }
  }
}

// One warp per kRows rows of the listed matrices; cols % 8 == 0, rows and x 16-byte aligned.
// y [n_tokens, rows] each. Each activation load (from L1/L2) feeds kRows rows: with several
// tokens the L1 traffic of the activations, not the weight stream, is what bounds a one-row warp.
// With `prefetch` each warp asks L2 for its rows before PdlWait.
template <DType kD, int kTok, int kRows>
__global__ void __launch_bounds__(kDecodeThreads)
    FloatDecodeKernel(MatrixList list, int64_t cols, const float* x, int64_t n_tokens,
                      bool prefetch) {
  constexpr int kUnroll = kFloatUnroll / kRows > 0 ? kFloatUnroll / kRows : 1;
  const int lane = threadIdx.x % kWarp;
  ListedRow at;
  if (!Locate(list, (static_cast<int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / kWarp) * kRows,
              kRows, &at))
    return;  // whole warps leave, touching no memory; no block barrier below
  const uint8_t* w = at.w;
  const int64_t rows = at.rows;
  const int64_t r0 = at.r;
  float* y = at.y;
  const uint8_t* row[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i)  // rows past the end re-read the last one, unwritten
    row[i] = w + (r0 + i < rows ? r0 + i : rows - 1) * cols * kElemBytes<kD>;
  if (prefetch) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) PrefetchL2(row[i], cols * kElemBytes<kD>, lane);
  }
  PdlWait();
  constexpr int64_t kStep = 8 * kWarp;  // elements a warp covers per load step
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTok) {
    const int nt = static_cast<int>(n_tokens - t0 < kTok ? n_tokens - t0 : kTok);
    const float* xs = x + t0 * cols;
    float acc[kRows][kTok];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int t = 0; t < kTok; ++t) acc[i][t] = 0.0f;
    for (int64_t c0 = lane * 8; c0 < cols; c0 += kStep * kUnroll) {
      Raw8 raw[kUnroll][kRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kStep;
        if (c < cols) {
#pragma unroll
          for (int i = 0; i < kRows; ++i) raw[u][i] = LoadRaw8<kD>(row[i], c);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kStep;
        if (c >= cols) break;
        float wv[kRows][8];
#pragma unroll
        for (int i = 0; i < kRows; ++i) Decode8<kD>(raw[u][i], wv[i]);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < nt) {
            const auto* xp = reinterpret_cast<const float4*>(xs + t * cols + c);
            const float4 a = __ldg(xp);
            const float4 b = __ldg(xp + 1);
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
              float s = acc[i][t];
              s = fmaf(wv[i][0], a.x, s);
              s = fmaf(wv[i][1], a.y, s);
              s = fmaf(wv[i][2], a.z, s);
              s = fmaf(wv[i][3], a.w, s);
              s = fmaf(wv[i][4], b.x, s);
              s = fmaf(wv[i][5], b.y, s);
              s = fmaf(wv[i][6], b.z, s);
              s = fmaf(wv[i][7], b.w, s);
              acc[i][t] = s;
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (r0 + i < rows) WriteRow<kTok>(acc[i], nt, lane, y + t0 * rows, rows, r0 + i);
  }
}

// The same product, one element a lane a step: any cols and alignment.
template <DType kD, int kTok>
__global__ void __launch_bounds__(kDecodeThreads)
    FloatScalarKernel(const uint8_t* w, int64_t rows, int64_t cols, const float* x,
                      int64_t n_tokens, float* y) {
  PdlWait();
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / kWarp;
  if (r >= rows) return;
  const uint8_t* row = w + r * cols * kElemBytes<kD>;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTok) {
    const int nt = static_cast<int>(n_tokens - t0 < kTok ? n_tokens - t0 : kTok);
    const float* xs = x + t0 * cols;
    float acc[kTok];
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[t] = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) {
      const float wv = WeightAt<kD>(row, c);
#pragma unroll
      for (int t = 0; t < kTok; ++t)
        if (t < nt) acc[t] = fmaf(wv, __ldg(xs + t * cols + c), acc[t]);
    }
    WriteRow<kTok>(acc, nt, lane, y + t0 * rows, rows, r);
  }
}

// ---- Q8_0 / Q4_0 -------------------------------------------------------------------------

// x [n_blocks_total * 32] float -> xq (int8, same layout) and dx [n_blocks_total], one warp per
// 32-block, bit for bit the CPU's quantizer (QuantizeLane).
__device__ __forceinline__ void QuantizeBlock(const float* x, int64_t b, int lane, int8_t* xq,
                                              float* dx) {
  float scale;
  xq[b * kWarp + lane] = QuantizeLane(x[b * kWarp + lane], &scale);
  if (lane == 0) dx[b] = scale;
}

__global__ void QuantizeActivationsKernel(const float* x, int64_t n_blocks_total, int8_t* xq,
                                          float* dx) {
  PdlWait();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (b >= n_blocks_total) return;
  QuantizeBlock(x, b, threadIdx.x % kWarp, xq, dx);
}

template <DType kD>
constexpr int kQBlockBytes = kD == DType::kQ8_0 ? 34 : 18;
constexpr int kChunkBlocks = kWarp * kQuantBlocksPerLane;  // blocks a warp stages at once
template <DType kD>
constexpr int kChunkBytes = kChunkBlocks* kQBlockBytes<kD>;  // 2176 (Q8_0), 1152 (Q4_0)
static_assert(kChunkBytes<DType::kQ8_0> % 16 == 0 && kChunkBytes<DType::kQ4_0> % 16 == 0,
              "each warp's staging area must stay 16-byte aligned");

// Copies n words of type V from global src[i] to shared dst[i], i < kRows, with the warp's lanes,
// at most kMax a lane a row; all loads of a lane are issued before its stores. Returns the bytes
// copied from each row.
template <typename V, int kMax, int kRows>
__device__ __forceinline__ int CopyWords(const uint8_t* const (&src)[kRows], int n,
                                         uint8_t* const (&dst)[kRows], int lane) {
  V v[kRows][kMax];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int k = 0; k < kMax; ++k)
      if (lane + k * kWarp < n)
        v[r][k] = __ldg(reinterpret_cast<const V*>(src[r]) + lane + k * kWarp);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int k = 0; k < kMax; ++k)
      if (lane + k * kWarp < n) reinterpret_cast<V*>(dst[r])[lane + k * kWarp] = v[r][k];
  return n * static_cast<int>(sizeof(V));
}

// Copies `bytes` (even, <= kChunkBytes) from global src[i] (2-byte aligned) to shared dst[i]
// (16-byte aligned), i < kRows, with the warp's lanes, using 16- or 4-byte loads when every src
// allows. All loads of a lane (every row's) are issued before its stores, so the chunks' bytes
// are in flight together.
template <DType kD, int kRows>
__device__ __forceinline__ void StageChunks(const uint8_t* const (&src)[kRows], int bytes,
                                            uint8_t* const (&dst)[kRows], int lane) {
  constexpr int kMaxVec16 = (kChunkBytes<kD> / 16 + kWarp - 1) / kWarp;
  constexpr int kMaxVec4 = (kChunkBytes<kD> / 4 + kWarp - 1) / kWarp;
  uintptr_t addr = 0;
#pragma unroll
  for (int i = 0; i < kRows; ++i) addr |= reinterpret_cast<uintptr_t>(src[i]);
  int done = 0;  // bytes copied by the wide loads
  if ((addr & 15u) == 0)
    done = CopyWords<uint4, kMaxVec16, kRows>(src, bytes / 16, dst, lane);
  else if ((addr & 3u) == 0)
    done = CopyWords<uint32_t, kMaxVec4, kRows>(src, bytes / 4, dst, lane);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const auto* s = reinterpret_cast<const uint16_t*>(src[r]);
    auto* d = reinterpret_cast<uint16_t*>(dst[r]);
    for (int i = done / 2 + lane; i < bytes / 2; i += kWarp) d[i] = __ldg(s + i);
  }
}

// A staged block's 32 weight codes as 8 words of 4 signed bytes, word k = elements 4k..4k+3.
template <DType kD>
__device__ __forceinline__ void UnpackCodes(const uint8_t* blk, int (&wq)[8]) {
  const auto* q = reinterpret_cast<const uint16_t*>(blk + 2);  // 2-byte aligned
  if constexpr (kD == DType::kQ8_0) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      wq[k] = static_cast<int>(static_cast<uint32_t>(q[2 * k]) |
                               (static_cast<uint32_t>(q[2 * k + 1]) << 16));
  } else {  // byte j: element j (low nibble), element j + 16 (high nibble); codes offset by 8
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t n =
          static_cast<uint32_t>(q[2 * k]) | (static_cast<uint32_t>(q[2 * k + 1]) << 16);
      wq[k] = static_cast<int>(__vsub4(n & 0x0f0f0f0fu, 0x08080808u));
      wq[k + 4] = static_cast<int>(__vsub4((n >> 4) & 0x0f0f0f0fu, 0x08080808u));
    }
  }
}

// The warp's dots of kRows rows (n_blocks blocks each) with nt <= kTok tokens' quantized
// activations: xq [nt, n_blocks * 32] int8 (rows 16-byte aligned), dx [nt, n_blocks], in global
// or shared memory; the rows are staged together through the warp's `my[i]`, kChunkBlocks
// blocks at a time. Row i's sums are the same bits whatever kRows.
template <DType kD, int kTok, int kRows>
__device__ __forceinline__ void QuantRowDots(const uint8_t* const (&row)[kRows], int64_t n_blocks,
                                             const int8_t* xq, const float* dx, int nt,
                                             uint8_t* const (&my)[kRows], int lane,
                                             float (&acc)[kRows][kTok]) {
  constexpr int kBB = kQBlockBytes<kD>;
  const int64_t cols = n_blocks * 32;
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[i][t] = 0.0f;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
    const int nb = static_cast<int>(n_blocks - b0 < kChunkBlocks ? n_blocks - b0 : kChunkBlocks);
    const uint8_t* src[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) src[i] = row[i] + b0 * kBB;
    __syncwarp();  // the previous chunk's reads of `my` are done
    StageChunks<kD, kRows>(src, nb * kBB, my, lane);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kQuantBlocksPerLane; ++k) {
      const int bl = lane + k * kWarp;
      if (bl >= nb) break;
      const int64_t b = b0 + bl;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const uint8_t* blk = my[i] + bl * kBB;
        const float d = F16BitsToFloat(LoadU16(blk));
        int wq[8];
        UnpackCodes<kD>(blk, wq);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          if (t < nt) {
            const auto* xp = reinterpret_cast<const int4*>(xq + t * cols + b * 32);
            const int dot = Dot32(wq, xp[0], xp[1]);
            acc[i][t] = fmaf(static_cast<float>(dot), d * dx[t * n_blocks + b], acc[i][t]);
          }
        }
      }
    }
  }
}

// One warp per `rows_per_warp` consecutive rows of the listed matrices (each matrix's rows padded
// to a multiple of rows_per_warp, so that a warp's rows lie in one; the last warp's may be fewer),
// staged kS at a time: with kS = 2 two rows' loads are in flight instead of one (a warp's row of
// a 2048-wide Q4_0 matrix is 1,152 bytes, 36 a lane), at twice the registers (fewer resident
// warps: for matrices that give a warp several rows). xq [n_tokens, n_blocks * 32] int8 (rows
// 32-byte aligned), dx [n_tokens, n_blocks]; y [n_tokens, rows] each. With `prefetch` each warp
// asks L2 for all its rows before PdlWait: the reads of the later rows then come from L2 while the
// earlier ones are computed, which keeps more of a long matrix (lm_head) in flight than a warp's
// staged rows.
template <DType kD, int kTok, int kS>
__global__ void __launch_bounds__(kDecodeThreads)
    QuantDecodeKernel(MatrixList list, int64_t n_blocks, const int8_t* xq, const float* dx,
                      int64_t n_tokens, int rows_per_warp, bool prefetch) {
  __shared__ __align__(16) uint8_t stage[kDecodeWarps][kS][kChunkBytes<kD>];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  ListedRow at;
  const int64_t g = (static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp) * rows_per_warp;
  // Whole warps leave (past the list, or on a matrix's padding), touching no memory; only
  // __syncwarp below.
  if (!Locate(list, g, rows_per_warp, &at) || at.r >= at.rows) return;
  const uint8_t* w = at.w;
  const int64_t rows = at.rows;
  float* y = at.y;
  const int64_t r0 = at.r;
  const int64_t r1 = r0 + rows_per_warp < rows ? r0 + rows_per_warp : rows;
  const int64_t row_bytes = n_blocks * kQBlockBytes<kD>;
  if (prefetch) PrefetchL2(w + r0 * row_bytes, (r1 - r0) * row_bytes, lane);
  PdlWait();
  const int64_t cols = n_blocks * 32;
  uint8_t* areas[kS];
#pragma unroll
  for (int i = 0; i < kS; ++i) areas[i] = stage[warp][i];
  uint8_t* const first_area[1] = {areas[0]};
  for (int64_t r = r0; r < r1; r += kS) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTok) {
      const int nt = static_cast<int>(n_tokens - t0 < kTok ? n_tokens - t0 : kTok);
      if (r + kS <= r1) {  // warp-uniform
        const uint8_t* src[kS];
#pragma unroll
        for (int i = 0; i < kS; ++i) src[i] = w + (r + i) * row_bytes;
        float acc[kS][kTok];
        QuantRowDots<kD, kTok, kS>(src, n_blocks, xq + t0 * cols, dx + t0 * n_blocks, nt, areas,
                                   lane, acc);
#pragma unroll
        for (int i = 0; i < kS; ++i) WriteRow<kTok>(acc[i], nt, lane, y + t0 * rows, rows, r + i);
      } else {  // the warp's last rows, fewer than kS
        for (int64_t ri = r; ri < r1; ++ri) {
          const uint8_t* const src[1] = {w + ri * row_bytes};
          float acc[1][kTok];
          QuantRowDots<kD, kTok, 1>(src, n_blocks, xq + t0 * cols, dx + t0 * n_blocks, nt,
                                    first_area, lane, acc);
          WriteRow<kTok>(acc[0], nt, lane, y + t0 * rows, rows, ri);
        }
      }
    }
  }
}

// Shared memory of FusedQuantDecodeKernel: the warps' staging areas, then xq [nt, cols] and
// dx [nt, cols / 32].
template <DType kD>
size_t FusedSmemBytes(int64_t nt, int64_t cols) {
  return static_cast<size_t>(kDecodeWarps * kChunkBytes<kD> + nt * cols + nt * (cols / 32) * 4);
}

// QuantizeX and QuantDecodeKernel in one launch, for nt <= kTok tokens: each block quantizes x
// into its shared memory (the same bits as QuantizeActivationsKernel), then its warps take rows
// of the matrices grid-stride, one row at a time. Saves the quantizing launch, and puts the small
// matrices of a step (k, v) in the same wave as the large ones (q).
template <DType kD, int kTok>
__global__ void __launch_bounds__(kDecodeThreads)
    FusedQuantDecodeKernel(MatrixList p, int64_t n_blocks, const float* x, int nt) {
  PdlWait();
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t cols = n_blocks * 32;
  uint8_t* const mine[1] = {smem + warp * kChunkBytes<kD>};
  auto* xq = reinterpret_cast<int8_t*>(smem + kDecodeWarps * kChunkBytes<kD>);
  auto* dx = reinterpret_cast<float*>(xq + nt * cols);
  for (int64_t b = warp; b < nt * n_blocks; b += kDecodeWarps) QuantizeBlock(x, b, lane, xq, dx);
  __syncthreads();
  const int64_t total = ListedRows(p, 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kDecodeWarps;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp; g < total; g += stride) {
    ListedRow at;
    Locate(p, g, 1, &at);
    const uint8_t* const src[1] = {at.w + at.r * n_blocks * kQBlockBytes<kD>};
    float acc[1][kTok];
    QuantRowDots<kD, kTok, 1>(src, n_blocks, xq, dx, nt, mine, lane, acc);
    WriteRow<kTok>(acc[0], nt, lane, at.y, at.rows, at.r);
  }
}

}  // namespace moetier::cuda::dense_decode
