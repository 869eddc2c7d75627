// The CPU expert executor: a routing's experts computed where their bytes lie (host banks of
// any tier), on the model's thread pool. Three pool jobs whatever the number of tokens and
// experts, each cut into tasks that read distinct weight bytes:
//   A. gate and up rows of every chosen expert, (expert, row block) tasks, each finishing its
//      rows with silu(gate) * up, so the hidden activations never take a separate pass;
//   B. down rows, (output row block) tasks, each running every chosen expert's rows of that
//      block and adding them into `out` with the routing weights, experts in ascending id
//      order: no two tasks write the same element, so no locks and no reduction pass;
//   B'. for decode steps (few tokens per expert) instead (expert, row block) tasks, each one long
//      run of an expert's down rows, then the same routed sum by output row blocks.
// Tokens are grouped by expert, so with many tokens (prefill, many sequences) every chosen
// expert's bytes are read once per call. Activations are prepared (quantized for q8_0/q4_0
// weights) once for all tokens, then gathered per expert. Every element's arithmetic is fixed by
// its token, expert and row, never by the task split, the thread count or the other tokens:
// results are bit-identical across all three (but see AMX in kernels/cpu/README.md).
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "experts/expert_executor.h"
#include "kernels/cpu/matmul.h"
#include "ops/expert_source.h"

namespace moetier {

class CpuExpertExecutor final : public ExpertExecutor {
 public:
  // `experts` and `pool` must outlive the executor. Contract: one thread calls Run at a time.
  CpuExpertExecutor(const ExpertSource& experts, ThreadPool& pool, int64_t d_model);

  void Run(int64_t layer, const Routing& routing, const float* x, float* out) override;
  void SetPhaseTimes(PhaseTimes* times) override { times_ = times; }

 private:
  void PrepareInputs(const Routing& r, const float* x, DType up_dtype);
  void GateUp(int64_t layer, const Routing& r, int64_t width, DType up_dtype);
  void PrepareHidden(const Routing& r, int64_t width, DType down_dtype);
  void DownExpertMajor(int64_t layer, const Routing& r, int64_t width, DType down_dtype,
                       float* out);
  void DownRowMajor(int64_t layer, const Routing& r, int64_t width, DType down_dtype, float* out);
  void RoutedSum(const Routing& r, const float* y, float* out);
  const kernels::PreparedActivations& InputOf(const Routing& r, size_t a) const {
    return r.n_tokens > 1 ? x_prep_[a + 1] : x_prep_[0];
  }

  const ExpertSource& experts_;
  ThreadPool& pool_;
  int64_t d_model_;
  PhaseTimes* times_ = nullptr;
  // Scratch kept from call to call, so steady-state steps allocate nothing.
  std::vector<float> hidden_, up_, y_;  // [n_assign, width] x2, [n_assign, d_model]
  std::vector<kernels::PreparedActivations> x_prep_, h_prep_;
};

}  // namespace moetier
