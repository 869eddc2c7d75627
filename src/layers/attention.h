// Self-attention sublayer: q/k/v projections (+ optional bias, optional per-head RMSNorm of q and
// k), rotary embedding, append to the KV cache, causal grouped-query attention over the cache,
// output projection.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "layers/batch.h"
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

// x: [batch.n_tokens(), d_model], token t at batch.positions[t] of its sequence; out: the same
// shape (overwritten). Writes this layer's K/V rows of every token into `kv` first, so tokens of
// one sequence in the batch (a prompt chunk) see each other causally.
void SelfAttention(Workspace& ws, const AttentionWeights& w, const AttentionShape& shape,
                   const Rope& rope, int64_t layer, const Batch& batch, KvPool& kv, const float* x,
                   float* out);

// What CausalAttention does to its tasks' own query heads before attending (so that the work is
// spread over the pool rather than left to the caller): the per-head RMS norm (when `norm` is
// non-empty), then RoPE with the rows of `angles` ([n_tokens, head_dim], Rope::Angles).
struct QueryPrologue {
  const std::vector<float>* norm = nullptr;
  float eps = 1e-6f;
  const Rope* rope = nullptr;
  const float* angles = nullptr;
};

// Causal attention of q: [n_tokens, n_heads, head_dim], token t at batch.positions[t], against
// the keys and values of its own sequence's positions [first, position] in `kv`'s layer
// (first > 0 only with a sliding window); out: [n_tokens, n_heads * head_dim]. Parallel over
// (token, key/value head, slice of its query heads): a task reads each key/value row once for
// all the query heads it holds. Per-thread scratch grows to the longest context seen and is
// kept (no allocation in steady-state decode). With a `prologue`, q is first normed and rotated
// in place, head by head, by the task that attends with it.
void CausalAttention(ThreadPool& pool, float* q, const Batch& batch, const KvPool& kv,
                     int64_t layer, const AttentionShape& shape, float* out,
                     const QueryPrologue* prologue = nullptr);

// Query heads per attention task. A whole group (the query heads sharing one key/value head)
// reads the cache once; it is halved, down to kMinAttnHeadsPerTask (the kernel's tile height),
// while that leaves fewer than kAttnTasksPerThread tasks per thread (decode: one token, a few
// key/value heads). MOETIER_ATTN_HEADS_PER_TASK=N overrides. Results do not depend on it.
inline constexpr int64_t kMinAttnHeadsPerTask = 2;
inline constexpr int64_t kAttnTasksPerThread = 2;
int64_t AttentionHeadsPerTask(int64_t n_tokens, int64_t n_kv_heads, int64_t group, int threads);

}  // namespace moetier
