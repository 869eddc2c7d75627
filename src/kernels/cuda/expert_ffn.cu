// The routed experts on the GPU (expert_ffn.h). Two paths, both over all active experts of a
// step in one launch per projection, both reading the device routing on the device (no host
// sync, so a step can be captured in a CUDA graph):
//
// Decode (DecodeKernel): persistent blocks (one resident wave) walk work items (active expert,
// 16-row tile of each matrix); each item's rows stream through shared memory in column chunks of
// ~1 KiB a row, double-buffered with cp.async; each warp then takes 2 rows (x2 for gate and up)
// and dots them with up to 8 of the expert's tokens at once (fp32 FMA for bf16, dp4a on 8-bit
// activations for Q8_0/Q4_0), so every weight byte is read from HBM once per 8 tokens. Staging
// through shared memory lets the quantized formats (34- and 18-byte blocks, 2-byte aligned) load
// rows with 16-byte coalesced cp.async wherever a row starts 16-byte aligned (every real shape:
// d_model and width multiples of 256) and still decode block by block.
// Bandwidth: the design aims at ~80 % of the H200's 4.8 TB/s once a call has a few hundred
// items. As written it is issue- and latency-bound (16 warps an SM: 120 registers and 111 KiB of
// shared memory a block): measured on the H200, Mixtral-sized experts (4096 x 14336, one token)
// stream at 1.9 (Q4_0), 2.3 (Q8_0) and 3.1 (bf16) TB/s, and a Qwen3-30B-A3B decode token (8
// experts of 2048 x 768, 7-24 MiB) takes 39-50 µs for the whole call.
//
// Prefill (GemmKernel): per active expert a grouped GEMM on tensor cores (WMMA 16x16x16, bf16
// operands, fp32 accumulation), 64 tokens x 64 rows a block, the expert's token rows gathered
// (token_of) and rounded to bf16, Q8_0/Q4_0 weights dequantized to bf16 in shared memory.
//
// Both write per-assignment outputs (h, then y); RoutedSumKernel adds each token's y rows in its
// assign_of order (experts ascending) with fp32 FMA: fixed order, no atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/expert_ffn.h"

namespace moetier::cuda {

namespace {

enum class Fmt { kBF16, kQ8_0, kQ4_0 };

constexpr int kQBlock = 32;  // weights (and activation quants) per Q8_0/Q4_0 block
constexpr int kQ8Bytes = 34;
constexpr int kQ4Bytes = 18;

// Bytes of n_cols consecutive weights of a row (n_cols a multiple of 32 for Q8_0/Q4_0).
__host__ __device__ constexpr int64_t FmtBytes(Fmt f, int64_t n_cols) {
  return f == Fmt::kBF16 ? 2 * n_cols : n_cols / kQBlock * (f == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes);
}

// The step's tokens per expert (n_tokens * top_k / n_experts) from which Run takes the
// tensor-core path: where the GEMMs (64-token tiles) overtook the decode kernels (one pass over
// an expert's rows per 8 tokens, CUDA-core multiply-adds) on the H200 with Qwen3-30B-A3B shapes
// (128 experts of 2048 x 768, top-8): between 8 and 16 tokens per expert for Q8_0/Q4_0
// (1.0 vs 1.1 ms at 8, 1.9 vs 1.1 ms at 16), at 4 already for bf16 (0.74 vs 0.70 ms), whose
// decode kernel does 8 fp32 FMAs per 16 weight bytes.
constexpr double kPrefillMinTokensPerExpertQuant = 10.0;
constexpr double kPrefillMinTokensPerExpertBf16 = 4.0;

// ---------------------------------------------------------------------------------------------
// Shared-memory staging (cp.async, sm_80+).

__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src) {
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Copies bytes [src, src + n_bytes) to dst (16-byte aligned shared memory), thread `tid` of
// n_threads taking every n_threads-th piece: 16-byte cp.async where src is 16-byte aligned,
// 4-byte where it is 4-byte aligned, and the rest (a short tail, or all of a range that is only
// 2-byte aligned) by 2-byte loads and stores that complete at once. The asynchronous part lands
// by the caller's CpAsyncWait; either part is visible to other threads after a barrier.
// n_bytes even, src 2-byte aligned. Reads no byte outside the range.
__device__ __forceinline__ void CopyToShared(unsigned char* dst, const unsigned char* src,
                                             int n_bytes, int tid, int n_threads) {
  const auto addr = reinterpret_cast<uintptr_t>(src);
  int done = 0;
  if ((addr & 15) == 0) {
    done = n_bytes & ~15;
    for (int i = tid * 16; i < done; i += n_threads * 16) CpAsync16(dst + i, src + i);
  } else if ((addr & 3) == 0) {
    done = n_bytes & ~3;
    for (int i = tid * 4; i < done; i += n_threads * 4) CpAsync4(dst + i, src + i);
  }
  for (int i = done + tid * 2; i < n_bytes; i += n_threads * 2)
    *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
}

// ---------------------------------------------------------------------------------------------
// Weight decoding from shared memory.

// Eight words of a 2-byte aligned run of 32 bytes at p; reads up to 4 bytes past it (the
// staging slots have 16 bytes of padding).
__device__ __forceinline__ void LoadUnaligned32(const unsigned char* p, uint32_t w[8]) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto* words = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(addr & 3) * 8;  // 0 or 16
  uint32_t lo = words[0];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t hi = words[k + 1];
    w[k] = __funnelshift_r(lo, hi, shift);
    lo = hi;
  }
}

// One Q8_0/Q4_0 block at blk (2-byte aligned shared memory) as 32 8-bit weights packed four to
// a word in element order and its scale: Q8_0's signed quants, Q4_0's codes 0-15 (the dot then
// subtracts 8 x the sum of the activation quants: exact, and cheaper than unpacking to code - 8).
template <Fmt F>
__device__ __forceinline__ void LoadQuantBlock(const unsigned char* blk, int32_t q[8], float& d) {
  d = F16BitsToFloat(*reinterpret_cast<const uint16_t*>(blk));
  if constexpr (F == Fmt::kQ8_0) {
    uint32_t w[8];
    LoadUnaligned32(blk + 2, w);
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = static_cast<int32_t>(w[k]);
  } else {
    // 16 code bytes: byte i holds weight i (low nibble) and weight i + 16 (high nibble).
    const auto addr = reinterpret_cast<uintptr_t>(blk + 2);
    const auto* words = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
    const unsigned shift = static_cast<unsigned>(addr & 3) * 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t v = __funnelshift_r(words[k], words[k + 1], shift);
      q[k] = static_cast<int32_t>(v & 0x0F0F0F0Fu);
      q[k + 4] = static_cast<int32_t>((v >> 4) & 0x0F0F0F0Fu);
    }
  }
}

// Exact integer dot of 32 weights with 32 activation quants (xa: quants 0-15, xb: 16-31).
__device__ __forceinline__ int32_t Dot32(const int32_t q[8], int4 xa, int4 xb) {
  int32_t s = __dp4a(q[0], xa.x, 0);
  s = __dp4a(q[1], xa.y, s);
  s = __dp4a(q[2], xa.z, s);
  s = __dp4a(q[3], xa.w, s);
  s = __dp4a(q[4], xb.x, s);
  s = __dp4a(q[5], xb.y, s);
  s = __dp4a(q[6], xb.z, s);
  return __dp4a(q[7], xb.w, s);
}

__device__ __forceinline__ float Silu(float g) {
  return g / (1.0f + expf(-g));
}

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
// exactly as the CPU's kernels do (kernels/cpu/matmul_scalar.cpp): d = amax / 127,
// q = round-half-even(clamp(x * (127 / amax), -127, 127)), amax = 0 giving d = 0 and q = 0.
// IEEE division and no contraction, so the quants match the CPU's bit for bit. A warp a block.
__global__ void QuantizeRowsKernel(const float* x, int64_t n_rows, int64_t n_cols, int8_t* q,
                                   int64_t q_stride, float* d) {
  const int64_t blocks_per_row = n_cols / kQBlock;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (blk >= n_rows * blocks_per_row) return;  // warp-uniform
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t row = blk / blocks_per_row, col = (blk % blocks_per_row) * kQBlock + lane;
  const float v = x[row * n_cols + col];
  const float amax = WarpMax(fabsf(v));
  const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
  const float scaled = fminf(127.0f, fmaxf(-127.0f, v * inv));
  q[row * q_stride + col] = static_cast<int8_t>(rintf(scaled));
  if (lane == 0) d[blk] = amax / 127.0f;
}

// ---------------------------------------------------------------------------------------------
// Prefill path: WMMA grouped GEMM.

constexpr int kGemmM = 64;         // tokens a block
constexpr int kGemmN = 64;         // rows of each matrix a block
constexpr int kGemmK = 32;         // columns a step: one Q8_0/Q4_0 block a row
constexpr int kGemmThreads = 128;  // 4 warps, 2 x 2, each 32 x 32 outputs of each matrix
// Shared-memory row pitch of the bf16 tiles: 80 bytes keeps every 16x16 fragment's start 32-byte
// aligned (WMMA's requirement) and rows off the same banks.
constexpr int kGemmLd = kGemmK + 8;
constexpr int kGemmLdC = kGemmN + 4;  // fp32 output staging pitch
__host__ __device__ constexpr int GemmSmemBytes(int n_mats) {
  const int tiles = (kGemmM + n_mats * kGemmN) * kGemmLd * 2;
  const int outs = n_mats * kGemmM * kGemmLdC * 4;
  return tiles > outs ? tiles : outs;
}

struct GemmArgs {
  const int32_t* n_active;
  const int32_t* experts;
  const int32_t* begin;
  const int32_t* token_of;  // as DecodeArgs
  const ExpertPointers* table;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* act = nullptr;  // [*, cols] fp32
  float* out = nullptr;        // [n_assignments, rows]
};

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(FloatToBf16Bits(lo)) |
         (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
}

// dst[0..16) (bf16, 16-byte aligned shared memory) = the 16 activations of `row` from column c
// rounded to bf16, zeros past n_cols or for a null row.
__device__ __forceinline__ void LoadActTile(const float* row, int64_t c, int64_t n_cols,
                                            uint16_t* dst) {
  uint32_t w[8];
  if (row == nullptr) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = 0;
  } else if (c + 16 <= n_cols && (reinterpret_cast<uintptr_t>(row + c) & 15) == 0) {
    const auto* v = reinterpret_cast<const float4*>(row + c);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 f = v[k];
      w[2 * k] = PackBf16(f.x, f.y);
      w[2 * k + 1] = PackBf16(f.z, f.w);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t i = c + 2 * k;
      w[k] = PackBf16(i < n_cols ? row[i] : 0.0f, i + 1 < n_cols ? row[i + 1] : 0.0f);
    }
  }
  auto* out = reinterpret_cast<uint4*>(dst);
  out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  out[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// dst[0..16) (bf16, 16-byte aligned shared memory) = weights [c, c + 16) of `row` (c a multiple
// of 16; half = (c / 16) % 2 picks a Q8_0/Q4_0 block's half), dequantized to bf16; zeros past
// n_cols or for a null row.
template <Fmt F>
__device__ __forceinline__ void LoadWeightTile(const unsigned char* row, int64_t c, int64_t n_cols,
                                               uint16_t* dst) {
  uint32_t w[8];
  if (row == nullptr) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = 0;
  } else if constexpr (F == Fmt::kBF16) {
    const unsigned char* src = row + 2 * c;
    if (c + 16 <= n_cols && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
      const auto* v = reinterpret_cast<const uint4*>(src);
      const uint4 a = v[0], b = v[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
      w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {  // rows of an even number of bf16: pairs are 4-byte aligned and whole
#pragma unroll
      for (int k = 0; k < 8; ++k)
        w[k] = c + 2 * k < n_cols ? reinterpret_cast<const uint32_t*>(src)[k] : 0u;
    }
  } else {
    constexpr int kBlockBytes = F == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes;
    const unsigned char* blk = row + (c / kQBlock) * kBlockBytes;
    const int half = static_cast<int>((c / 16) % 2);
    const float d = F16BitsToFloat(*reinterpret_cast<const uint16_t*>(blk));
    const auto* qs = reinterpret_cast<const uint16_t*>(blk + 2);  // 2-byte aligned
    float f[16];
    if constexpr (F == Fmt::kQ8_0) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint16_t two = qs[half * 8 + k];
        f[2 * k] = static_cast<float>(static_cast<int8_t>(two & 0xFF)) * d;
        f[2 * k + 1] = static_cast<float>(static_cast<int8_t>(two >> 8)) * d;
      }
    } else {  // weights 0-15: low nibbles of the 16 bytes; 16-31: high nibbles
      const int nib = half * 4;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint16_t two = qs[k];
        f[2 * k] = static_cast<float>(((two >> nib) & 0xF) - 8) * d;
        f[2 * k + 1] = static_cast<float>(((two >> (8 + nib)) & 0xF) - 8) * d;
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = PackBf16(f[2 * k], f[2 * k + 1]);
  }
  auto* out = reinterpret_cast<uint4*>(dst);
  out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  out[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// As DecodeKernel, on tensor cores: the assignments [blockIdx.y * 64, +64) of active expert
// blockIdx.z against rows [blockIdx.x * 64, +64) of its matrices.
template <Fmt F, int kMats>
__global__ void __launch_bounds__(kGemmThreads) GemmKernel(GemmArgs p) {
  namespace wmma = nvcuda::wmma;
  const int a = static_cast<int>(blockIdx.z);
  if (a >= *p.n_active) return;
  const int32_t first = p.begin[a];
  const int n_assign = p.begin[a + 1] - first;
  const int m0 = static_cast<int>(blockIdx.y) * kGemmM;
  if (m0 >= n_assign) return;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemmN;
  const ExpertPointers e = p.table[p.experts[a]];
  const void* mat_ptr[2] = {kMats == 2 ? e.gate : e.down, e.up};

  __shared__ __align__(128) unsigned char smem[GemmSmemBytes(kMats)];
  auto* sa = reinterpret_cast<uint16_t*>(smem);  // [kGemmM][kGemmLd] bf16
  uint16_t* sb = sa + kGemmM * kGemmLd;          // [kMats][kGemmN][kGemmLd] bf16
  auto* sc = reinterpret_cast<float*>(smem);     // [kMats][kGemmM][kGemmLdC], after the k loop

  // Loads: thread -> one row of the A tile and of each B tile, 16 of the 32 columns.
  const int tid = static_cast<int>(threadIdx.x);
  const int ld_row = tid / 2, ld_col = (tid % 2) * 16;
  const float* a_row = nullptr;
  if (m0 + ld_row < n_assign) {
    const int32_t j = first + m0 + ld_row;
    a_row = p.act + (p.token_of != nullptr ? int64_t{p.token_of[j]} : int64_t{j}) * p.cols;
  }
  const unsigned char* b_row[kMats];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
    b_row[mat] = n0 + ld_row < p.rows ? static_cast<const unsigned char*>(mat_ptr[mat]) +
                                            (n0 + ld_row) * FmtBytes(F, p.cols)
                                      : nullptr;

  const int warp = tid / kWarp, wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMats][2][2];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) wmma::fill_fragment(acc[mat][i][jj], 0.0f);

  const auto* sa_bf = reinterpret_cast<const __nv_bfloat16*>(sa);
  const auto* sb_bf = reinterpret_cast<const __nv_bfloat16*>(sb);
  for (int64_t k0 = 0; k0 < p.cols; k0 += kGemmK) {
    LoadActTile(a_row, k0 + ld_col, p.cols, sa + ld_row * kGemmLd + ld_col);
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat)
      LoadWeightTile<F>(b_row[mat], k0 + ld_col, p.cols,
                        sb + (mat * kGemmN + ld_row) * kGemmLd + ld_col);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGemmK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(fa[i], sa_bf + (wm * 32 + i * 16) * kGemmLd + kk, kGemmLd);
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          // B = the weight rows, [n][k] in memory: a column-major k x n operand.
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, sb_bf + (mat * kGemmN + wn * 32 + jj * 16) * kGemmLd + kk,
                                 kGemmLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[mat][i][jj], fa[i], fb, acc[mat][i][jj]);
        }
    }
    __syncthreads();  // the tiles are refilled (or reused as sc) next
  }

#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        wmma::store_matrix_sync(
            sc + (mat * kGemmM + wm * 32 + i * 16) * kGemmLdC + wn * 32 + jj * 16, acc[mat][i][jj],
            kGemmLdC, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kGemmM * kGemmN; idx += kGemmThreads) {
    const int i = idx / kGemmN, n = idx % kGemmN;
    if (m0 + i >= n_assign || n0 + n >= p.rows) continue;
    float v = sc[i * kGemmLdC + n];
    if constexpr (kMats == 2) v = Silu(v) * sc[(kGemmM + i) * kGemmLdC + n];
    p.out[static_cast<int64_t>(first + m0 + i) * p.rows + n0 + n] = v;
  }
}

// ---------------------------------------------------------------------------------------------
// The routed sum.

// out[t, c] = Σ over k < top_k, in order, of weight_of[j] * y[j, c], j = assign_of[t, k] (token
// t's assignments, experts ascending): fp32 FMA from 0, a fixed order.
__global__ void RoutedSumKernel(const float* y, const int32_t* assign_of, const float* weight_of,
                                int64_t n_tokens, int64_t top_k, int64_t d_model, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * d_model) return;
  const int64_t t = idx / d_model, c = idx % d_model;
  float acc = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) {
    const int64_t j = assign_of[t * top_k + k];
    acc = fmaf(weight_of[j], y[j * d_model + c], acc);
  }
  out[idx] = acc;
}

// The scratch of one ExpertFfn (its State), sized at Create.
struct CudaFree {
  void operator()(unsigned char* p) const { cudaFree(p); }
};

// The scratch of one ExpertFfn (its State): one allocation made at Create, carved into the
// buffers below (each 256-byte aligned). One cudaMalloc rather than a DeviceBuffer per buffer:
// DeviceBuffer::Create does not compile under nvcc 13 (its `return b;` into Expected needs the
// C++20 implicit move that nvcc's front end lacks).
struct Scratch {
  ExpertShape shape;
  ExpertFfnOptions options;
  int64_t x_q_stride = 0;         // bytes a row of quantized x: d_model rounded up to 16
  int64_t h_q_stride = 0;         // of quantized h: width rounded up to 16
  int decode_blocks_gate_up = 0;  // resident blocks of the decode kernels: their grid sizes
  int decode_blocks_down = 0;
  std::unique_ptr<unsigned char, CudaFree> memory;
  float* h = nullptr;     // [max_tokens * top_k, width]
  float* y = nullptr;     // [max_tokens * top_k, d_model]
  int8_t* x_q = nullptr;  // [max_tokens, x_q_stride]   (Q8_0/Q4_0 only)
  float* x_d = nullptr;   // [max_tokens, d_model / 32]
  int8_t* h_q = nullptr;  // [max_tokens * top_k, h_q_stride]
  float* h_d = nullptr;   // [max_tokens * top_k, width / 32]
};

constexpr int kElementwiseThreads = 256;

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Fmt FmtOf(DType t) {
  return t == DType::kQ8_0 ? Fmt::kQ8_0 : t == DType::kQ4_0 ? Fmt::kQ4_0 : Fmt::kBF16;
}

// Lets the decode kernels of format F use their shared memory (over the 48 KiB default, with
// the carveout at its largest so that two blocks fit an SM) and returns how many blocks of
// each are resident on the whole device at once: the size of their persistent grids.
template <Fmt F, int kMats>
Status PrepareDecodeKernel(int& resident_blocks) {
  const auto kernel = DecodeKernel<F, kMats>;
  const std::string what =
      kMats == 2 ? "ExpertFfn: the gate+up decode kernel" : "ExpertFfn: the down decode kernel";
  MT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               DecodeSmemBytes(F, kMats)),
                          what + " (shared memory)");
  MT_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared),
      what + " (carveout)");
  int device = 0, n_sms = 0, per_sm = 0;
  MT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), what);
  MT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device),
                          what);
  MT_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                              &per_sm, kernel, kDecodeThreads, DecodeSmemBytes(F, kMats)),
                          what + " (occupancy)");
  resident_blocks = std::max(1, n_sms * per_sm);
  return OkStatus();
}

template <Fmt F>
Status PrepareDecodeKernels(Scratch& s) {
  MT_RETURN_IF_ERROR((PrepareDecodeKernel<F, 2>(s.decode_blocks_gate_up)));
  return PrepareDecodeKernel<F, 1>(s.decode_blocks_down);
}

Status ValidateShape(const ExpertShape& shape, int64_t max_tokens, int64_t top_k) {
  const std::string dims =
      "d_model " + std::to_string(shape.d_model) + ", width " + std::to_string(shape.width);
  if (shape.dtype != DType::kBF16 && !IsBlockQuantized(shape.dtype))
    return Status::Error("ExpertFfn: expert dtype " + std::string(DTypeName(shape.dtype)) +
                         " is not supported on the GPU (BF16, Q8_0 or Q4_0)");
  if (shape.d_model <= 0 || shape.width <= 0)
    return Status::Error("ExpertFfn: expert shape (" + dims + ") must be positive");
  const int64_t multiple = shape.dtype == DType::kBF16 ? 2 : kQBlock;
  if (shape.d_model % multiple != 0 || shape.width % multiple != 0)
    return Status::Error("ExpertFfn: " + std::string(DTypeName(shape.dtype)) + " experts need " +
                         dims + " to be multiples of " + std::to_string(multiple));
  if (max_tokens <= 0 || top_k <= 0 || max_tokens * top_k > INT32_MAX)
    return Status::Error("ExpertFfn: max_tokens " + std::to_string(max_tokens) + " and top_k " +
                         std::to_string(top_k) + " must be positive, their product < 2^31");
  return OkStatus();
}

// Queues q/d = x [n_rows, n_cols] quantized per 32-block (n_rows > 0).
void QuantizeRows(const float* x, int64_t n_rows, int64_t n_cols, int8_t* q, int64_t q_stride,
                  float* d, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = kElementwiseThreads / kWarp;
  const int64_t n_blocks = n_rows * (n_cols / kQBlock);
  QuantizeRowsKernel<<<static_cast<unsigned>(CeilDiv(n_blocks, kWarpsPerBlock)),
                       kElementwiseThreads, 0, stream>>>(x, n_rows, n_cols, q, q_stride, d);
}

DecodeArgs DecodeArgsFor(const DeviceRouting& r, const ExpertPointers* table, int64_t rows,
                         int64_t cols, const int32_t* token_of, float* out) {
  DecodeArgs p;
  p.n_active = r.n_active;
  p.experts = r.experts;
  p.begin = r.begin;
  p.token_of = token_of;
  p.table = table;
  p.rows = rows;
  p.cols = cols;
  p.out = out;
  return p;
}

// Blocks of a decode launch over `rows` rows: one resident wave, or fewer where the step has
// fewer work items (16-row tiles of the most experts it can activate).
unsigned DecodeGrid(int resident_blocks, const DeviceRouting& r, int64_t rows) {
  const int64_t items = r.max_active() * CeilDiv(rows, kDecodeRows);
  return static_cast<unsigned>(std::min<int64_t>(resident_blocks, items));
}

// Gate+up then down on the decode kernels: h, then y. Activations quantized once each for
// Q8_0/Q4_0 (x before gate+up, h before down).
template <Fmt F>
void RunDecode(Scratch& s, const DeviceRouting& r, const ExpertPointers* table, const float* x,
               cudaStream_t stream) {
  const int64_t d_model = s.shape.d_model, width = s.shape.width;
  DecodeArgs up = DecodeArgsFor(r, table, width, d_model, r.token_of, s.h);
  DecodeArgs down = DecodeArgsFor(r, table, d_model, width, nullptr, s.y);
  if constexpr (F == Fmt::kBF16) {
    up.act = x;
    down.act = s.h;
  } else {
    QuantizeRows(x, r.n_tokens, d_model, s.x_q, s.x_q_stride, s.x_d, stream);
    up.act_q = s.x_q, up.act_d = s.x_d, up.q_stride = s.x_q_stride;
    down.act_q = s.h_q, down.act_d = s.h_d, down.q_stride = s.h_q_stride;
  }
  DecodeKernel<F, 2><<<DecodeGrid(s.decode_blocks_gate_up, r, width), kDecodeThreads,
                       DecodeSmemBytes(F, 2), stream>>>(up);
  if constexpr (F != Fmt::kBF16)
    QuantizeRows(s.h, r.n_assignments(), width, s.h_q, s.h_q_stride, s.h_d, stream);
  DecodeKernel<F, 1><<<DecodeGrid(s.decode_blocks_down, r, d_model), kDecodeThreads,
                       DecodeSmemBytes(F, 1), stream>>>(down);
}

// Gate+up then down as tensor-core grouped GEMMs: h, then y.
template <Fmt F>
void RunPrefill(Scratch& s, const DeviceRouting& r, const ExpertPointers* table, const float* x,
                cudaStream_t stream) {
  const int64_t d_model = s.shape.d_model, width = s.shape.width;
  // No expert has more assignments than there are tokens (a token picks an expert once).
  const auto m_tiles = static_cast<unsigned>(CeilDiv(r.n_tokens, kGemmM));
  const auto n_active = static_cast<unsigned>(r.max_active());
  GemmArgs up{r.n_active, r.experts, r.begin, r.token_of, table, width, d_model, x, s.h};
  GemmKernel<F, 2><<<dim3(static_cast<unsigned>(CeilDiv(width, kGemmN)), m_tiles, n_active),
                     kGemmThreads, 0, stream>>>(up);
  GemmArgs down{r.n_active, r.experts, r.begin, nullptr, table, d_model, width, s.h, s.y};
  GemmKernel<F, 1><<<dim3(static_cast<unsigned>(CeilDiv(d_model, kGemmN)), m_tiles, n_active),
                     kGemmThreads, 0, stream>>>(down);
}

// Carves s's buffers out of one allocation for max_tokens tokens, n_assign assignments.
Status AllocateScratch(Scratch& s, int64_t max_tokens, int64_t n_assign) {
  constexpr int64_t kAlign = 256;
  const bool quant = s.x_q_stride > 0;
  const int64_t sizes[6] = {
      n_assign * s.shape.width * 4,
      n_assign * s.shape.d_model * 4,
      quant ? max_tokens * s.x_q_stride : 0,
      quant ? max_tokens * (s.shape.d_model / kQBlock) * 4 : 0,
      quant ? n_assign * s.h_q_stride : 0,
      quant ? n_assign * (s.shape.width / kQBlock) * 4 : 0,
  };
  int64_t offsets[6], total = 0;
  for (int i = 0; i < 6; ++i) {
    offsets[i] = total;
    total += CeilDiv(sizes[i], kAlign) * kAlign;
  }
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(total));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: later calls must not see it
    return CudaStatus(err, "ExpertFfn: allocating " + std::to_string(total) +
                               " bytes of VRAM for the experts' scratch");
  }
  s.memory.reset(static_cast<unsigned char*>(p));
  unsigned char* base = s.memory.get();
  s.h = reinterpret_cast<float*>(base + offsets[0]);
  s.y = reinterpret_cast<float*>(base + offsets[1]);
  if (quant) {
    s.x_q = reinterpret_cast<int8_t*>(base + offsets[2]);
    s.x_d = reinterpret_cast<float*>(base + offsets[3]);
    s.h_q = reinterpret_cast<int8_t*>(base + offsets[4]);
    s.h_d = reinterpret_cast<float*>(base + offsets[5]);
  }
  return OkStatus();
}

bool UsePrefill(ExpertFfnPath path, DType dtype, const DeviceRouting& r) {
  if (path != ExpertFfnPath::kAuto) return path == ExpertFfnPath::kPrefill;
  const double tokens_per_expert =
      static_cast<double>(r.n_assignments()) / static_cast<double>(r.n_experts);
  return tokens_per_expert >=
         (dtype == DType::kBF16 ? kPrefillMinTokensPerExpertBf16 : kPrefillMinTokensPerExpertQuant);
}

template <Fmt F>
void RunFmt(Scratch& s, const DeviceRouting& r, const ExpertPointers* table, const float* x,
            cudaStream_t stream) {
  if (UsePrefill(s.options.path, s.shape.dtype, r)) {
    RunPrefill<F>(s, r, table, x, stream);
  } else {
    RunDecode<F>(s, r, table, x, stream);
  }
}

}  // namespace

struct ExpertFfn::State : Scratch {};

Expected<ExpertFfn> ExpertFfn::Create(const ExpertShape& shape, int64_t max_tokens, int64_t top_k,
                                      const ExpertFfnOptions& options) {
  MT_RETURN_IF_ERROR(ValidateShape(shape, max_tokens, top_k));
  auto s = std::make_unique<State>();
  s->shape = shape;
  s->options = options;
  const Fmt f = FmtOf(shape.dtype);
  if (f != Fmt::kBF16) {
    s->x_q_stride = CeilDiv(shape.d_model, 16) * 16;
    s->h_q_stride = CeilDiv(shape.width, 16) * 16;
  }
  MT_RETURN_IF_ERROR(AllocateScratch(*s, max_tokens, max_tokens * top_k));
  switch (f) {
    case Fmt::kBF16:
      MT_RETURN_IF_ERROR(PrepareDecodeKernels<Fmt::kBF16>(*s));
      break;
    case Fmt::kQ8_0:
      MT_RETURN_IF_ERROR(PrepareDecodeKernels<Fmt::kQ8_0>(*s));
      break;
    case Fmt::kQ4_0:
      MT_RETURN_IF_ERROR(PrepareDecodeKernels<Fmt::kQ4_0>(*s));
      break;
  }
  ExpertFfn ffn;
  ffn.s_ = std::move(s);
  return Expected<ExpertFfn>(std::move(ffn));
}

ExpertFfn::ExpertFfn() = default;
ExpertFfn::~ExpertFfn() = default;
ExpertFfn::ExpertFfn(ExpertFfn&&) noexcept = default;
ExpertFfn& ExpertFfn::operator=(ExpertFfn&&) noexcept = default;

void ExpertFfn::Run(const DeviceRouting& r, const ExpertPointers* table, const float* x, float* out,
                    cudaStream_t stream) {
  if (r.n_tokens == 0) return;
  Scratch& s = *s_;
  switch (FmtOf(s.shape.dtype)) {
    case Fmt::kBF16:
      RunFmt<Fmt::kBF16>(s, r, table, x, stream);
      break;
    case Fmt::kQ8_0:
      RunFmt<Fmt::kQ8_0>(s, r, table, x, stream);
      break;
    case Fmt::kQ4_0:
      RunFmt<Fmt::kQ4_0>(s, r, table, x, stream);
      break;
  }
  const int64_t n_out = r.n_tokens * s.shape.d_model;
  RoutedSumKernel<<<static_cast<unsigned>(CeilDiv(n_out, kElementwiseThreads)), kElementwiseThreads,
                    0, stream>>>(s.y, r.assign_of, r.weight_of, r.n_tokens, r.top_k,
                                 s.shape.d_model, out);
}

}  // namespace moetier::cuda
