// Self-attention sublayer: q/k/v projections (+ optional bias, optional per-head RMSNorm of q and
// k), rotary embedding, append to the KV cache, causal grouped-query attention over the cache,
// output projection.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "layers/kv_cache.h"
#include "layers/rope.h"
#include "layers/workspace.h"

namespace moetier {

struct AttentionShape {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: every earlier position
  float norm_eps = 1e-6f;      // for q_norm / k_norm
};

struct AttentionWeights {
  TensorView q, k, v;  // [n_heads * head_dim, d_model], [n_kv_heads * head_dim, d_model] x2
  TensorView o;        // [d_model, n_heads * head_dim]
  std::vector<float> q_bias, k_bias, v_bias;  // empty when the model has none
  std::vector<float> q_norm, k_norm;          // [head_dim]; empty when the model has none
};

// x: [n_tokens, d_model] at positions cache.n_past() + t; out: [n_tokens, d_model] (overwritten).
// Writes this layer's K/V rows; the caller advances the cache after the last layer.
void SelfAttention(Workspace& ws, const AttentionWeights& w, const AttentionShape& shape,
                   const Rope& rope, int64_t layer, KvCache& cache, const float* x,
                   int64_t n_tokens, float* out);

// What CausalAttention does to its tasks' own query heads before attending (so that the work is
// spread over the pool rather than left to the caller): the per-head RMS norm (when `norm` is
// non-empty), then RoPE with the rows of `angles` ([n_tokens, head_dim], Rope::Angles).
struct QueryPrologue {
  const std::vector<float>* norm = nullptr;
  float eps = 1e-6f;
  const Rope* rope = nullptr;
  const float* angles = nullptr;
};

// Causal attention of q: [n_tokens, n_heads, head_dim] at positions pos0 + t against keys and
// values [0, pos0 + n_tokens) of [position, n_kv_heads, head_dim]; out: [n_tokens, n_heads *
// head_dim]. Parallel over (token, key/value head, slice of its query heads): a task reads each
// key/value row once for all the query heads it holds. `key_capacity` (>= pos0 + n_tokens): the
// positions the caller's cache has room for; each thread's score scratch is sized for it, so it
// grows only when the cache does (no allocation in steady-state decode). With a `prologue`, q is
// first normed and rotated in place, head by head, by the task that attends with it.
void CausalAttention(ThreadPool& pool, float* q, int64_t n_tokens, int64_t pos0, const float* keys,
                     const float* values, const AttentionShape& shape, int64_t key_capacity,
                     float* out, const QueryPrologue* prologue = nullptr);

// Query heads per attention task. A whole group (the query heads sharing one key/value head)
// reads the cache once; it is halved, down to kMinAttnHeadsPerTask (the kernel's tile height),
// while that leaves fewer than kAttnTasksPerThread tasks per thread (decode: one token, a few
// key/value heads). MOETIER_ATTN_HEADS_PER_TASK=N overrides. Results do not depend on it.
inline constexpr int64_t kMinAttnHeadsPerTask = 2;
inline constexpr int64_t kAttnTasksPerThread = 2;
int64_t AttentionHeadsPerTask(int64_t n_tokens, int64_t n_kv_heads, int64_t group, int threads);

}  // namespace moetier
