// The decode path of the expert FFN (expert_ffn.cu says how it works): DecodeKernel over
// (active expert, row tile) work items, and the activations' 8-bit quantization.
#pragma once

#include "kernels/cuda/expert_ffn_common.cuh"

namespace moetier::cuda::expert_ffn {

// ---------------------------------------------------------------------------------------------
// Decode path.

constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = kDecodeWarps * kWarp;
constexpr int kRowsPerWarp = 2;
constexpr int kDecodeRows = kDecodeWarps * kRowsPerWarp;  // rows of each matrix per block
// Tokens dotted per pass over the rows: 8 tokens x 2 rows x 2 matrices accumulators per lane.
// An expert with more tokens takes more passes (re-reading its rows, mostly from L2).
constexpr int kDecodeTokens = 8;

// Columns per staged chunk: ~1 KiB of each row, whole 32-blocks (one Q8_0 block per lane,
// two Q4_0 blocks per lane, 16 bytes of bf16 per lane twice).
__host__ __device__ constexpr int ChunkCols(Fmt f) {
  return f == Fmt::kBF16 ? 512 : f == Fmt::kQ8_0 ? 1024 : 2048;
}
// A row chunk's slot: its bytes plus 16 of padding (LoadUnaligned32 reads a word past a block).
__host__ __device__ constexpr int WeightSlotBytes(Fmt f) {
  return static_cast<int>(FmtBytes(f, ChunkCols(f))) + 16;
}
// A token's activation chunk: fp32 values (bf16 weights), or quants then their fp32 scales.
__host__ __device__ constexpr int ActSlotBytes(Fmt f) {
  return f == Fmt::kBF16 ? ChunkCols(f) * 4 : ChunkCols(f) + ChunkCols(f) / kQBlock * 4;
}
// Two buffers of kMats x 16 row chunks and 8 token chunks: 97-109 KiB for gate+up, two blocks
// an SM on sm_90 (one on sm_80).
__host__ __device__ constexpr int DecodeSmemBytes(Fmt f, int n_mats) {
  return 2 * (n_mats * kDecodeRows * WeightSlotBytes(f) + kDecodeTokens * ActSlotBytes(f));
}
static_assert(WeightSlotBytes(Fmt::kBF16) % 16 == 0 && WeightSlotBytes(Fmt::kQ8_0) % 16 == 0 &&
                  WeightSlotBytes(Fmt::kQ4_0) % 16 == 0 && ActSlotBytes(Fmt::kBF16) % 16 == 0 &&
                  ActSlotBytes(Fmt::kQ8_0) % 16 == 0 && ActSlotBytes(Fmt::kQ4_0) % 16 == 0,
              "staging slots keep 16-byte alignment for cp.async and vector loads");

struct DecodeArgs {
  const int32_t* n_active;
  const int32_t* experts;
  const int32_t* begin;
  const int32_t* token_of;  // activation row of assignment j: token_of[j]; null: row j itself
  const ExpertPointers* table;
  int64_t rows = 0;  // of each matrix
  int64_t cols = 0;
  const float* act = nullptr;     // bf16 weights: [*, cols] fp32
  const int8_t* act_q = nullptr;  // Q8_0/Q4_0: [*, q_stride] quants
  const float* act_d = nullptr;   //            [*, cols / 32] scales
  int64_t q_stride = 0;
  float* out = nullptr;  // [n_assignments, rows]
};

// Where a decode block is in its work: item (active expert a, row tile) = (item / n_tiles,
// item % n_tiles), the pass over the expert's assignments (8 a pass) and the column chunk; and
// what the item's expert needs (its assignments, its matrices).
template <int kMats>
struct DecodeCursor {
  int item = 0;
  int pass = 0;
  int chunk = 0;
  int32_t first = 0;  // the expert's first assignment
  int n_assign = 0;   // and how many it has
  const unsigned char* mats[kMats] = {};
};

// A persistent decode block: it walks items blockIdx.x, blockIdx.x + gridDim.x, ..., each as
// passes x chunks, one stage each, staging the next while computing the current.
template <Fmt F, int kMats>
struct DecodeBlock {
  using Cursor = DecodeCursor<kMats>;
  DecodeArgs p;
  unsigned char* smem;
  int64_t row_bytes;
  int n_tiles, n_items, n_chunks;
  int warp, lane;

  // The expert of c.item: its assignments and matrices (c.item < n_items).
  __device__ void Load(Cursor& c) const {
    const int a = c.item / n_tiles;
    c.first = p.begin[a];
    c.n_assign = p.begin[a + 1] - c.first;
    const ExpertPointers e = p.table[p.experts[a]];
    if constexpr (kMats == 2) {
      c.mats[0] = static_cast<const unsigned char*>(e.gate);
      c.mats[1] = static_cast<const unsigned char*>(e.up);
    } else {
      c.mats[0] = static_cast<const unsigned char*>(e.down);
    }
  }
  // The stage after c; c.item >= n_items once the block's work is done.
  __device__ void Advance(Cursor& c) const {
    if (++c.chunk < n_chunks) return;
    c.chunk = 0;
    if (++c.pass * kDecodeTokens < c.n_assign) return;
    c.pass = 0;
    c.item += static_cast<int>(gridDim.x);
    if (c.item < n_items) Load(c);
  }
  // This warp's first row, the pass's first assignment and token count, the chunk's columns.
  __device__ int64_t Row0(const Cursor& c) const {
    return static_cast<int64_t>(c.item % n_tiles) * kDecodeRows + warp * kRowsPerWarp;
  }
  __device__ int32_t J0(const Cursor& c) const { return c.first + c.pass * kDecodeTokens; }
  __device__ int NTok(const Cursor& c) const {
    return min(kDecodeTokens, c.n_assign - c.pass * kDecodeTokens);
  }
  __device__ int64_t C0(const Cursor& c) const {
    return static_cast<int64_t>(c.chunk) * ChunkCols(F);
  }
  __device__ int NCols(const Cursor& c) const {
    return static_cast<int>(std::min<int64_t>(ChunkCols(F), p.cols - C0(c)));
  }

  __device__ unsigned char* WeightSlot(int buf, int mat, int rr) const {
    const int slot = (buf * kMats + mat) * kDecodeRows + warp * kRowsPerWarp + rr;
    return smem + slot * WeightSlotBytes(F);
  }
  __device__ unsigned char* ActSlot(int buf, int t) const {
    return smem + 2 * kMats * kDecodeRows * WeightSlotBytes(F) +
           (buf * kDecodeTokens + t) * ActSlotBytes(F);
  }

  // Queues stage c (this warp's rows, the pass's tokens, the chunk's columns) into buffer buf.
  __device__ void Stage(const Cursor& c, int buf) const {
    const int64_t c0 = C0(c), row0 = Row0(c);
    const int n_cols = NCols(c), n_tok = NTok(c);
    const int32_t j0 = J0(c);
    const int64_t w_off = FmtBytes(F, c0);
    const int w_bytes = static_cast<int>(FmtBytes(F, n_cols));
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr)
        if (row0 + rr < p.rows)
          CopyToShared(WeightSlot(buf, mat, rr), c.mats[mat] + (row0 + rr) * row_bytes + w_off,
                       w_bytes, lane, kWarp);
    for (int t = 0; t < n_tok; ++t) {
      const int32_t j = j0 + t;
      const int64_t arow = p.token_of != nullptr ? p.token_of[j] : j;
      unsigned char* dst = ActSlot(buf, t);
      if constexpr (F == Fmt::kBF16) {
        CopyToShared(dst, reinterpret_cast<const unsigned char*>(p.act + arow * p.cols + c0),
                     n_cols * 4, static_cast<int>(threadIdx.x), kDecodeThreads);
      } else {
        CopyToShared(dst, reinterpret_cast<const unsigned char*>(p.act_q + arow * p.q_stride + c0),
                     n_cols, static_cast<int>(threadIdx.x), kDecodeThreads);
        CopyToShared(dst + ChunkCols(F),
                     reinterpret_cast<const unsigned char*>(p.act_d + arow * (p.cols / kQBlock) +
                                                            c0 / kQBlock),
                     n_cols / kQBlock * 4, static_cast<int>(threadIdx.x), kDecodeThreads);
      }
    }
  }

  // acc[mat][rr][t] += this lane's share of chunk (buffer buf, n_cols columns) of row rr of
  // matrix mat dotted with token t. Rows past the matrix compute garbage that is never written.
  __device__ void Dot(const Cursor& c, int buf,
                      float (&acc)[kMats][kRowsPerWarp][kDecodeTokens]) const {
    if constexpr (F == Fmt::kBF16) {
      DotBf16(buf, NCols(c), NTok(c), acc);
    } else {
      DotQuant(buf, NCols(c), NTok(c), acc);
    }
  }

  __device__ void DotBf16(int buf, int n_cols, int n_tok,
                          float (&acc)[kMats][kRowsPerWarp][kDecodeTokens]) const {
    const int n_units = (n_cols + 7) / 8;  // 8 weights (16 bytes) a unit
    for (int u = lane; u < n_units; u += kWarp) {
      if (u * 8 + 8 <= n_cols) {
        float w[kMats][kRowsPerWarp][8];
#pragma unroll
        for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
          for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const uint4 v = *reinterpret_cast<const uint4*>(WeightSlot(buf, mat, rr) + u * 16);
            const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              w[mat][rr][2 * k] = Bf16BitsToFloat(static_cast<uint16_t>(words[k] & 0xFFFFu));
              w[mat][rr][2 * k + 1] = Bf16BitsToFloat(static_cast<uint16_t>(words[k] >> 16));
            }
          }
#pragma unroll
        for (int t = 0; t < kDecodeTokens; ++t) {
          if (t >= n_tok) break;
          const auto* xs = reinterpret_cast<const float4*>(ActSlot(buf, t) + u * 32);
          const float4 x0 = xs[0], x1 = xs[1];
          const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
          for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
            for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
              for (int e = 0; e < 8; ++e)
                acc[mat][rr][t] = fmaf(w[mat][rr][e], x[e], acc[mat][rr][t]);
        }
      } else {  // the row's last, partial unit (n_cols not a multiple of 8)
        for (int col = u * 8; col < n_cols; ++col) {
#pragma unroll
          for (int t = 0; t < kDecodeTokens; ++t) {
            if (t >= n_tok) break;
            const float x = reinterpret_cast<const float*>(ActSlot(buf, t))[col];
#pragma unroll
            for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
              for (int rr = 0; rr < kRowsPerWarp; ++rr) {
                const uint16_t bits =
                    reinterpret_cast<const uint16_t*>(WeightSlot(buf, mat, rr))[col];
                acc[mat][rr][t] = fmaf(Bf16BitsToFloat(bits), x, acc[mat][rr][t]);
              }
          }
        }
      }
    }
  }

  // One matrix at a time (its 2 rows' decoded blocks in registers), so gate+up stays within
  // 128 registers; the activation quants are re-read from shared memory for the second matrix.
  __device__ void DotQuant(int buf, int n_cols, int n_tok,
                           float (&acc)[kMats][kRowsPerWarp][kDecodeTokens]) const {
    constexpr int kBlockBytes = F == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes;
    const int n_blocks = n_cols / kQBlock;
    for (int b = lane; b < n_blocks; b += kWarp) {
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat) {
        int32_t q[kRowsPerWarp][8];
        float d[kRowsPerWarp];
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr)
          LoadQuantBlock<F>(WeightSlot(buf, mat, rr) + b * kBlockBytes, q[rr], d[rr]);
#pragma unroll
        for (int t = 0; t < kDecodeTokens; ++t) {
          if (t >= n_tok) break;
          const unsigned char* xs = ActSlot(buf, t);
          const int4 xa = *reinterpret_cast<const int4*>(xs + b * kQBlock);
          const int4 xb = *reinterpret_cast<const int4*>(xs + b * kQBlock + 16);
          const float dx = reinterpret_cast<const float*>(xs + ChunkCols(F))[b];
          int32_t offset = 0;  // Q4_0: 8 x the sum of the 32 activation quants
          if constexpr (F == Fmt::kQ4_0) {
            constexpr int32_t kOnes[8] = {0x01010101, 0x01010101, 0x01010101, 0x01010101,
                                          0x01010101, 0x01010101, 0x01010101, 0x01010101};
            offset = 8 * Dot32(kOnes, xa, xb);
          }
#pragma unroll
          for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int32_t dot = Dot32(q[rr], xa, xb) - offset;
            acc[mat][rr][t] = fmaf(static_cast<float>(dot), d[rr] * dx, acc[mat][rr][t]);
          }
        }
      }
    }
  }

  // Sums the lanes' shares and writes this warp's rows of the pass's assignments: h =
  // silu(gate) * up for gate+up, y for down. Lane t writes token t.
  __device__ void Write(const Cursor& c, float (&acc)[kMats][kRowsPerWarp][kDecodeTokens]) const {
    const int64_t row0 = Row0(c);
    const int32_t j0 = J0(c);
    const int n_tok = NTok(c);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      if (row0 + rr >= p.rows) continue;  // warp-uniform: every lane takes part in the sums
#pragma unroll
      for (int t = 0; t < kDecodeTokens; ++t) {
        if (t >= n_tok) break;  // block-uniform
        float v = WarpSum(acc[0][rr][t]);
        if constexpr (kMats == 2) v = Silu(v) * WarpSum(acc[1][rr][t]);
        if (lane == t) p.out[static_cast<int64_t>(j0 + t) * p.rows + row0 + rr] = v;
      }
    }
  }
};

// kMats = 2: h[j, rows] = silu(gate · a) ⊙ (up · a); kMats = 1: y[j, rows] = down · a; for
// every assignment j of every active expert, 16 rows a work item, items spread over a grid of
// persistent blocks (one wave: the launcher sizes it to the resident blocks).
template <Fmt F, int kMats>
__global__ void __launch_bounds__(kDecodeThreads, 2) DecodeKernel(DecodeArgs p) {
  PdlWait();
  extern __shared__ __align__(16) unsigned char decode_smem[];
  DecodeBlock<F, kMats> blk{p, decode_smem};
  blk.row_bytes = FmtBytes(F, p.cols);
  blk.n_tiles = static_cast<int>((p.rows + kDecodeRows - 1) / kDecodeRows);
  blk.n_items = *p.n_active * blk.n_tiles;
  blk.n_chunks = static_cast<int>((p.cols + ChunkCols(F) - 1) / ChunkCols(F));
  blk.warp = static_cast<int>(threadIdx.x) / kWarp;
  blk.lane = static_cast<int>(threadIdx.x) % kWarp;
  DecodeCursor<kMats> cur;
  cur.item = static_cast<int>(blockIdx.x);
  if (cur.item >= blk.n_items) return;  // block-uniform, before any barrier
  blk.Load(cur);
  DecodeCursor<kMats> next = cur;

  float acc[kMats][kRowsPerWarp][kDecodeTokens];
  blk.Stage(cur, 0);
  CpAsyncCommit();
  for (int s = 0;; ++s) {
    blk.Advance(next);
    const bool more = next.item < blk.n_items;
    if (more) {
      blk.Stage(next, (s + 1) & 1);  // its buffer's last reader finished at the barrier below
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (cur.chunk == 0) {
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
          for (int t = 0; t < kDecodeTokens; ++t) acc[mat][rr][t] = 0.0f;
    }
    blk.Dot(cur, s & 1, acc);
    if (cur.chunk == blk.n_chunks - 1) blk.Write(cur, acc);
    __syncthreads();
    if (!more) break;
    cur = next;
  }
}

// q [n_rows, q_stride] and d [n_rows, n_cols / 32] = x [n_rows, n_cols] quantized per 32-block
// exactly as the CPU's kernels do (QuantizeLane). A warp a block.
__global__ void QuantizeRowsKernel(const float* x, int64_t n_rows, int64_t n_cols, int8_t* q,
                                   int64_t q_stride, float* d) {
  PdlWait();
  const int64_t blocks_per_row = n_cols / kQBlock;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (blk >= n_rows * blocks_per_row) return;  // warp-uniform
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = blk / blocks_per_row, col = (blk % blocks_per_row) * kQBlock + lane;
  float scale;
  q[row * q_stride + col] = QuantizeLane(x[row * n_cols + col], &scale);
  if (lane == 0) d[blk] = scale;
}

}  // namespace moetier::cuda::expert_ffn
