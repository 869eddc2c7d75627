// Attention on the GPU over the paged KV cache (backend/kv_cache.h's layout, in device memory):
// the prologue (q/k biases, per-head RMS norms, RoPE at each token's position), the append of
// the step's K/V rows, and causal attention of each token over its own sequence's positions —
// a decode kernel (few query tokens, long contexts) and a flash-style prefill kernel (tiles of
// queries against tiles of keys, online softmax), chosen inside LaunchPagedAttention. Mirrors
// backend/cpu/paged_attention.h; tests/kernels/cuda/attention_test.cpp states the tolerances.
// All pointers are device addresses; work is queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace moetier::cuda {

// The pool: block b, layer l holds K [block_size, row] then V [block_size, row], row =
// n_kv_heads * head_dim, in `dtype` (kF32, kBF16 or kF16); blocks follow each other, each
// n_layers * 2 * block_size * row elements.
struct DeviceKvPool {
  DType dtype = DType::kBF16;
  int64_t n_layers = 0;
  int64_t n_blocks = 0;
  int64_t block_size = 16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  void* data = nullptr;
};

// One step's tokens, as backend/batch.h's Batch, in device memory.
struct DeviceBatch {
  int64_t n_tokens = 0;
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* seq_of = nullptr;        // [n_tokens]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks]: sequence s's blocks in order
  int64_t max_blocks = 0;                 // row stride of block_tables
  int32_t max_position = 0;               // the largest position of the step (sizes the grid)
};

struct AttentionDims {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: every earlier position; else the last `sliding_window`
  float norm_eps = 1e-6f;
};

// In place on q [T, n_heads * head_dim] and k [T, n_kv_heads * head_dim]: + bias (when not
// null), per-head RMS norm with q_norm / k_norm [head_dim] (when not null), then neox-style RoPE
// (dimension i pairs with i + head_dim/2) at angle positions[t] * inv_freq[i] (inv_freq
// [head_dim / 2], float32, theta^(-2i/head_dim) as backend/rope.h computes it in double);
// v += v_bias (when not null). Then every token's k and v rows are stored at its position's slot
// of its sequence's block in `layer`, converted to the pool's dtype (round to nearest even).
struct QkvPrologue {
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr;
};
void LaunchAttentionPrologue(const QkvPrologue& p, const AttentionDims& dims,
                             const DeviceBatch& batch, int64_t layer, DeviceKvPool kv, float* q,
                             float* k, float* v, cudaStream_t stream);

// Whether the kernels are built for this head_dim (8, 16, 32, 64, 128 or 256); the launchers must
// not be called with another (the caller checks at load).
bool AttentionHeadDimSupported(int64_t head_dim);

// Bytes of scratch LaunchPagedAttention uses for calls of at most `max_tokens` tokens whose
// positions are below `max_positions`: the partial softmax states of the decode kernel's splits
// of long contexts (flash-decoding). The caller allocates it once, at load.
size_t PagedAttentionScratchBytes(const AttentionDims& dims, int64_t max_tokens,
                                  int64_t max_positions);

// out[t, h, :] = Σ_p softmax_p(q[t, h, :] · K[p, h / group, :] / sqrt(head_dim)) · V[p, ...]
// over positions p of token t's sequence in [first, positions[t]] (first = 0, or
// positions[t] - sliding_window + 1 clamped to 0); group = n_heads / n_kv_heads. The keys of the
// step's own tokens must already be stored (LaunchAttentionPrologue). Scores and the softmax in
// fp32. q [T, n_heads * head_dim] and out (the same shape) are 16-byte aligned. `scratch`
// (`scratch_bytes`, from PagedAttentionScratchBytes) may be smaller than a call could use, or
// null: long contexts are then split over fewer blocks (slower, same results within rounding).
// Captures in a CUDA graph: no allocation, no host synchronization; the grid depends on
// n_tokens and max_position only.
void LaunchPagedAttention(const AttentionDims& dims, const DeviceBatch& batch, int64_t layer,
                          DeviceKvPool kv, const float* q, float* out, void* scratch,
                          size_t scratch_bytes, cudaStream_t stream);

}  // namespace moetier::cuda
