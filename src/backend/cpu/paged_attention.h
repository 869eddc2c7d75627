// The CPU's attention over the paged KV cache: the backend's Attend (biases, q/k norms, RoPE,
// the cache append, causal attention), parallel over (token, key/value head, slice of its query
// heads) on the thread pool.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/workspace.h"

namespace moetier {

// Backend::Attend on the CPU.
void AttendCpu(ThreadPool& pool, PhaseTimes* times, Workspace& ws, const AttentionWeights& w,
               const AttentionShape& shape, const Rope& rope, int64_t layer, const Batch& batch,
               KvPool& kv, float* q, float* k, float* v, float* out);

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
