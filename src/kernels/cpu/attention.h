// Scaled dot-product attention of the query heads that share one key/value head (grouped-query
// attention), float32, on the run-time instruction set. Math only: masks, positions and the
// cache layout are the caller's (layers/attention.cpp).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace moetier::kernels {

// For each query head g < n_q (rows q_stride floats apart):
//   p[g, j]   = softmax over j < n_keys of scale * dot(q[g], keys[j])
//   out[g, :] = sum over j of p[g, j] * values[j, :]       (out rows out_stride floats apart)
// keys[j] and values[j] are rows of head_dim floats, kv_stride floats apart. `scores` is the
// caller's scratch of n_q * n_keys floats. The key and value rows are read once for all n_q
// heads. Each output element's arithmetic is fixed by (n_keys, head_dim) alone, so results do
// not depend on how heads are grouped into calls or tokens into batches.
void AttendSharedKv(const float* q, int64_t n_q, int64_t q_stride, const float* keys,
                    const float* values, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                    float scale, float* scores, float* out, int64_t out_stride,
                    CpuIsa isa = ActiveCpuIsa());

}  // namespace moetier::kernels
