#include "kernels/cpu/attention.h"

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/elementwise.h"

namespace moetier::kernels {

void AttendSharedKvRuns(const float* q, int64_t n_q, int64_t q_stride, std::span<const KvRun> runs,
                        int64_t kv_stride, int64_t head_dim, float scale, float* scores, float* out,
                        int64_t out_stride, CpuIsa isa) {
  const isa::Kernels& k = SafeKernels(isa);
  int64_t n_keys = 0;
  for (const KvRun& r : runs) n_keys += r.n;
  int64_t first = 0;
  for (const KvRun& r : runs) {
    k.attn_scores(q, n_q, q_stride, r.keys, kv_stride, r.n, head_dim, scale, scores + first,
                  n_keys);
    first += r.n;
  }
  for (int64_t g = 0; g < n_q; ++g) SoftmaxRow(scores + g * n_keys, n_keys);
  first = 0;
  for (const KvRun& r : runs) {
    k.attn_values(scores + first, n_q, r.n, n_keys, r.values, kv_stride, head_dim, out, out_stride,
                  /*accumulate=*/first > 0);
    first += r.n;
  }
}

void AttendSharedKv(const float* q, int64_t n_q, int64_t q_stride, const float* keys,
                    const float* values, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                    float scale, float* scores, float* out, int64_t out_stride, CpuIsa isa) {
  const KvRun run{keys, values, n_keys};
  AttendSharedKvRuns(q, n_q, q_stride, std::span<const KvRun>(&run, 1), kv_stride, head_dim, scale,
                     scores, out, out_stride, isa);
}

}  // namespace moetier::kernels
