// The prefill kernel of paged attention (flash-attention style, fp32 on the CUDA cores): block
// (tile, kv head slice) holds kPrefillRows query rows — tokens_per_tile consecutive tokens times
// the heads_per_slice query heads of one key/value group — and walks the keys in tiles of kKeys
// staged in shared memory, with an online softmax per row. A tile's keys are read once for all
// its rows, so a prefill chunk reads each K/V row once per tokens_per_tile tokens.
//
// The tokens of a tile may belong to several sequences (a batch mixes decode tokens and prompt
// chunks, in any order): the block makes one pass per distinct sequence among them, each pass
// over that sequence's keys [min first, max position] of its rows, the other rows masked. A
// batch laid out sequence by sequence needs one pass per tile, two where a tile straddles a
// boundary.
//
// Cost: per key tile, 2 * kPrefillRows * kKeys * D FMAs from shared memory (float4 reads, 4x4 /
// 4xN register tiles); one or two blocks per SM (the shared tiles take 70-140 KiB). Tensor cores
// are not used.
#pragma once

#include <cmath>

#include "kernels/cuda/attention_common.cuh"

namespace moetier::cuda::attention {

inline constexpr int kPrefillRows = 64;      // query rows per block
inline constexpr int kPrefillThreads = 256;  // 16 x 16: 4 rows per thread, keys/columns by 16

struct PrefillParams {
  const float* q = nullptr;  // [T, n_heads, D]
  float* out = nullptr;      // [T, n_heads, D]
  const int32_t* positions = nullptr;
  const int32_t* seq_of = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  PoolRef pool;
  int32_t n_tokens = 0;
  int32_t n_heads = 0;
  int32_t group = 0;
  int32_t heads_per_slice = 0;  // min(group, kPrefillRows)
  int32_t slices = 0;           // ceil(group / heads_per_slice)
  int32_t tokens_per_tile = 0;  // kPrefillRows / heads_per_slice
  int32_t window = 0;
  float scale_log2 = 0.0f;
};

template <int D>
struct PrefillShape {
  // 32 keys per tile at D >= 128 keep the shared tiles within 141 KiB at D = 256.
  static constexpr int kKeys = D >= 128 ? 32 : 64;
  static constexpr int kLd = D + 4;  // row stride: 16-byte rows, conflict-free float4 reads
  static constexpr int kPLd = kKeys + 1;
  static constexpr int kKeysPerThread = kKeys / 16;
  static constexpr int kCols = D / 16;  // output columns per thread
  static constexpr size_t kSmemBytes =
      sizeof(float) * (kPrefillRows * kLd + 2 * kKeys * kLd + kPrefillRows * kPLd);

  // Output column of a thread's j-th register: float4 groups 64 columns apart from D = 64 up,
  // contiguous runs below.
  __device__ __forceinline__ static int Col(int tx, int j) {
    if constexpr (kCols >= 4) return (j / 4) * 64 + tx * 4 + j % 4;
    return tx * kCols + j;
  }
};

// Shared state of one block: its tokens and the current pass.
struct PrefillTokens {
  int32_t seq[kPrefillRows];  // -1 past the batch
  int32_t pos[kPrefillRows];
  int32_t first[kPrefillRows];
  int32_t done[kPrefillRows];    // 1 once a pass has covered its sequence
  int32_t row_lo[kPrefillRows];  // the row's keys in this pass; lo > hi when it takes no part
  int32_t row_hi[kPrefillRows];
  int32_t pass[3];  // sequence (-1: no pass left), lo, hi
};

// Stages keys [k0, k0 + kKeys) of the pass (zeros past hi) as float rows [kKeys, kLd].
template <int D, typename Kv>
__device__ __forceinline__ void LoadKvTile(const PrefillParams& p, const int32_t* table,
                                           int64_t head_off, int32_t k0, int32_t hi, float* ks,
                                           float* vs) {
  using S = PrefillShape<D>;
  constexpr int kPerRow = D / Kv::kVec;
  for (int i = threadIdx.x; i < S::kKeys * kPerRow; i += kPrefillThreads) {
    const int c = i / kPerRow;
    const int v = i % kPerRow;
    const int32_t kp = k0 + c;
    float kf[Kv::kVec], vf[Kv::kVec];
    if (kp <= hi) {
      const uint8_t* row =
          p.pool.data + KeyRowOffset(p.pool, table, kp) + head_off + static_cast<int64_t>(v) * 16;
      Kv::Load(row, kf);
      Kv::Load(row + p.pool.plane_bytes, vf);
    } else {
#pragma unroll
      for (int e = 0; e < Kv::kVec; ++e) kf[e] = vf[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < Kv::kVec; e += 4) {
      *reinterpret_cast<float4*>(&ks[c * S::kLd + v * Kv::kVec + e]) =
          make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
      *reinterpret_cast<float4*>(&vs[c * S::kLd + v * Kv::kVec + e]) =
          make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
    }
  }
}

// Thread 0 picks the next pass: the sequence of the first token not yet covered, and the span of
// keys its tokens in this tile need.
__device__ __forceinline__ void PickPass(PrefillTokens& tk, int n_tok) {
  int32_t seq = -1, lo = 0, hi = -1;
  for (int i = 0; i < n_tok; ++i) {
    if (tk.done[i]) continue;
    if (seq < 0) {
      seq = tk.seq[i];
      lo = tk.first[i];
      hi = tk.pos[i];
    }
    if (tk.seq[i] != seq) continue;
    lo = min(lo, tk.first[i]);
    hi = max(hi, tk.pos[i]);
    tk.done[i] = 1;
  }
  tk.pass[0] = seq;
  tk.pass[1] = lo;
  tk.pass[2] = hi;
}

// grid (ceil(T / tokens_per_tile), n_kv_heads * slices), kPrefillThreads threads,
// PrefillShape<D>::kSmemBytes of dynamic shared memory.
template <int D, typename Kv>
__global__ void __launch_bounds__(kPrefillThreads) PrefillKernel(PrefillParams p) {
  PdlWait();
  using S = PrefillShape<D>;
  extern __shared__ float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);  // [kPrefillRows, kLd]
  float* ks = qs + kPrefillRows * S::kLd;       // [kKeys, kLd]
  float* vs = ks + S::kKeys * S::kLd;           // [kKeys, kLd]
  float* ps = vs + S::kKeys * S::kLd;           // [kPrefillRows, kPLd]: probabilities
  __shared__ PrefillTokens tk;

  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int kvh = blockIdx.y / p.slices;
  const int slice = blockIdx.y % p.slices;
  const int gs = p.heads_per_slice;
  const int n_g = min(gs, p.group - slice * gs);
  const int n_tok = p.tokens_per_tile;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * n_tok;
  const int h0 = kvh * p.group + slice * gs;
  const int64_t head_off = static_cast<int64_t>(kvh) * D * p.pool.elem_bytes;

  if (tid < n_tok) {
    const int64_t t = t0 + tid;
    const bool in = t < p.n_tokens;
    tk.seq[tid] = in ? p.seq_of[t] : -1;
    tk.pos[tid] = in ? p.positions[t] : 0;
    tk.first[tid] = in ? FirstKey(tk.pos[tid], p.window) : 0;
    tk.done[tid] = in ? 0 : 1;
  }
  // Query rows r = (token r / gs, head r % gs); rows past the batch or the slice are zero.
  for (int i = tid; i < kPrefillRows * (D / 4); i += kPrefillThreads) {
    const int r = i / (D / 4);
    const int c = i % (D / 4);
    const int tt = r / gs;
    const int g = r % gs;
    const int64_t t = t0 + tt;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (tt < n_tok && t < p.n_tokens && g < n_g)
      x = reinterpret_cast<const float4*>(p.q + (t * p.n_heads + h0 + g) * D)[c];
    *reinterpret_cast<float4*>(&qs[r * S::kLd + 4 * c]) = x;
  }

  float m[4], l[4], o[4][S::kCols];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < S::kCols; ++j) o[i][j] = 0.0f;
  }

  for (;;) {
    __syncthreads();  // every thread is done with the span before; tk.seq/pos/first are stored
    if (tid == 0) PickPass(tk, n_tok);
    __syncthreads();
    const int32_t seq = tk.pass[0];
    if (seq < 0) break;  // uniform: every thread read the same word after the barrier
    const int32_t hi = tk.pass[2];
    if (tid < kPrefillRows) {
      const int tt = tid / gs;
      const bool in = tt < n_tok && tid % gs < n_g && tk.seq[tt] == seq;
      tk.row_lo[tid] = in ? tk.first[tt] : 1;
      tk.row_hi[tid] = in ? tk.pos[tt] : 0;
    }
    const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks;
    for (int32_t k0 = tk.pass[1]; k0 <= hi; k0 += S::kKeys) {
      LoadKvTile<D, Kv>(p, table, head_off, k0, hi, ks, vs);
      __syncthreads();  // the tiles and row_lo/row_hi are in place

      // Scores of rows ty*4 + i against keys tx + 16*j.
      float s[4][S::kKeysPerThread];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j) s[i][j] = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        float4 qv[4], kv[S::kKeysPerThread];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          qv[i] = *reinterpret_cast<const float4*>(&qs[(ty * 4 + i) * S::kLd + d]);
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j)
          kv[j] = *reinterpret_cast<const float4*>(&ks[(tx + 16 * j) * S::kLd + d]);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < S::kKeysPerThread; ++j) {
            s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
            s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
            s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
            s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
          }
      }
      // Online softmax per row; the 16 threads of a row are 16 lanes of one warp.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = ty * 4 + i;
        const int32_t lo_r = tk.row_lo[r];
        const int32_t hi_r = tk.row_hi[r];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j) {
          const int32_t kp = k0 + tx + 16 * j;
          s[i][j] = kp >= lo_r && kp <= hi_r ? s[i][j] * p.scale_log2 : -INFINITY;
          mx = fmaxf(mx, s[i][j]);
        }
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float m_new = fmaxf(m[i], mx);
        float alpha = 1.0f;
        float sum = 0.0f;
        if (m_new != -INFINITY) {  // the row has had a key
          alpha = exp2f(m[i] - m_new);
#pragma unroll
          for (int j = 0; j < S::kKeysPerThread; ++j) {
            s[i][j] = exp2f(s[i][j] - m_new);
            sum += s[i][j];
          }
        } else {
#pragma unroll
          for (int j = 0; j < S::kKeysPerThread; ++j) s[i][j] = 0.0f;
        }
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        l[i] = l[i] * alpha + sum;
        m[i] = m_new;
#pragma unroll
        for (int j = 0; j < S::kCols; ++j) o[i][j] *= alpha;
#pragma unroll
        for (int j = 0; j < S::kKeysPerThread; ++j) ps[r * S::kPLd + tx + 16 * j] = s[i][j];
      }
      __syncthreads();  // ps complete

      for (int c = 0; c < S::kKeys; ++c) {
        float pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pr[i] = ps[(ty * 4 + i) * S::kPLd + c];
        float vv[S::kCols];
        if constexpr (S::kCols >= 4) {
#pragma unroll
          for (int j = 0; j < S::kCols; j += 4) {
            const float4 x = *reinterpret_cast<const float4*>(&vs[c * S::kLd + S::Col(tx, j)]);
            vv[j] = x.x, vv[j + 1] = x.y, vv[j + 2] = x.z, vv[j + 3] = x.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < S::kCols; ++j) vv[j] = vs[c * S::kLd + S::Col(tx, j)];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < S::kCols; ++j) o[i][j] = fmaf(pr[i], vv[j], o[i][j]);
      }
      __syncthreads();  // before the next tile overwrites ks, vs, ps
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty * 4 + i;
    const int tt = r / gs;
    const int g = r % gs;
    const int64_t t = t0 + tt;
    if (tt >= n_tok || t >= p.n_tokens || g >= n_g) continue;
    const float inv = 1.0f / l[i];
    float* dst = p.out + (t * p.n_heads + h0 + g) * D;
#pragma unroll
    for (int j = 0; j < S::kCols; ++j) dst[S::Col(tx, j)] = o[i][j] * inv;
  }
}

}  // namespace moetier::cuda::attention
