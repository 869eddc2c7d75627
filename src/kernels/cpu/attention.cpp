#include "kernels/cpu/attention.h"

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/elementwise.h"

namespace moetier::kernels {

void AttendSharedKv(const float* q, int64_t n_q, int64_t q_stride, const float* keys,
                    const float* values, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                    float scale, float* scores, float* out, int64_t out_stride, CpuIsa isa) {
  const isa::Kernels& k = SafeKernels(isa);
  k.attn_scores(q, n_q, q_stride, keys, kv_stride, n_keys, head_dim, scale, scores);
  for (int64_t g = 0; g < n_q; ++g) SoftmaxRow(scores + g * n_keys, n_keys);
  k.attn_values(scores, n_q, n_keys, values, kv_stride, head_dim, out, out_stride);
}

}  // namespace moetier::kernels
