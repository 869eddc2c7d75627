// Scaled dot-product attention of the query heads that share one key/value head (grouped-query
// attention), float32, on the run-time instruction set. Math only: masks, positions and the
// cache layout are the caller's (layers/attention.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/cpu_isa.h"

namespace moetier::kernels {

// n consecutive key and value rows, kv_stride floats apart: one block of a paged KV cache (or a
// whole contiguous cache).
struct KvRun {
  const float* keys = nullptr;
  const float* values = nullptr;
  int64_t n = 0;
};

// For each query head g < n_q (rows q_stride floats apart), over the keys of `runs` in order
// (n_keys = the runs' total):
//   p[g, j]   = softmax over j < n_keys of scale * dot(q[g], key[j])
//   out[g, :] = sum over j of p[g, j] * value[j, :]       (out rows out_stride floats apart)
// Key and value rows are head_dim floats, kv_stride floats apart within a run. `scores` is the
// caller's scratch of n_q * n_keys floats. The key and value rows are read once for all n_q
// heads. Each output element's arithmetic is fixed by the run lengths and head_dim alone, so
// results depend neither on how heads are grouped into calls, nor on how many tokens a batch
// carries, nor on where the runs lie in memory.
void AttendSharedKvRuns(const float* q, int64_t n_q, int64_t q_stride, std::span<const KvRun> runs,
                        int64_t kv_stride, int64_t head_dim, float scale, float* scores, float* out,
                        int64_t out_stride, CpuIsa isa = ActiveCpuIsa());

// The same over one contiguous run of n_keys rows.
void AttendSharedKv(const float* q, int64_t n_q, int64_t q_stride, const float* keys,
                    const float* values, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                    float scale, float* scores, float* out, int64_t out_stride,
                    CpuIsa isa = ActiveCpuIsa());

}  // namespace moetier::kernels
