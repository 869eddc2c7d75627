// The CPU backend: every operation on the model's thread pool, with the kernels of
// kernels/cpu at the run-time instruction set, and routed experts on the CPU executor
// (experts/cpu_executor.h) over whatever host banks hold them.
#pragma once

#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/workspace.h"
#include "core/thread_pool.h"
#include "experts/cpu_executor.h"
#include "experts/memory_limits.h"
#include "ops/expert_source.h"

namespace moetier {

class CpuBackend final : public ComputeBackend {
 public:
  // n_threads <= 0: one per physical core. `experts` must outlive the backend.
  CpuBackend(int n_threads, const ExpertSource& experts, int64_t d_model);

  Status Hold(std::span<const TensorView* const>,
              std::span<const std::vector<float>* const>) override {
    return OkStatus();  // the CPU reads weights where they are
  }
  uint64_t KvMemoryFree() const override { return ReadHostMemoryInfo().available_bytes; }
  Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) override {
    return AllocateHostKv(n_bytes);
  }
  void BeginStep(const Batch& batch, const KvPool&, StepOutput) override;
  float* Activations(Act slot, int64_t n_tokens, int64_t width) override;
  void Embed(const TensorView& table, std::span<const int32_t> tokens, float* h) override;
  void RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
               const std::vector<float>& weight, float eps, int64_t d, float* y) override;
  void Add(const float* x, int64_t n, float* y) override;
  void MatMul(const float* x, int64_t n_tokens, std::span<const MatMulOut> targets) override;
  void SiluMul(float* gate, const float* up, int64_t n) override;
  void Attend(const AttentionWeights& w, const AttentionShape& shape, const Rope& rope,
              int64_t layer, const Batch& batch, KvPool& kv, float* q, float* k, float* v,
              float* out) override;
  void Moe(const TensorView& router, const RouterOptions& opts, int64_t layer, const float* x,
           int64_t n_tokens, float* out, float* router_logits) override;
  int64_t TakeActiveExperts() override { return std::exchange(active_experts_, 0); }
  int64_t ScanNonFinite(const float* x, int64_t n, int64_t slot) override;
  std::span<const int64_t> NonFiniteScans() override { return non_finite_; }
  Status EndStep() override { return OkStatus(); }
  void Logits(const float* x, int64_t n_rows, const TensorView& lm_head, float* logits) override;
  void ArgMaxLogits(const float* x, int64_t n_rows, const TensorView& lm_head, int32_t* ids,
                    int64_t scan_slot) override;
  void TopKLogits(const float* x, int64_t n_rows, const TensorView& lm_head, LogitCandidate* cands,
                  int32_t* counts, RowLogSum* sums, int64_t scan_slot) override;
  Status CopyLogitsRow(int64_t r, float* out) override;

  // The router alone: logits, softmax, top-k, and the tokens grouped by expert in `routing`
  // (what the executor schedules from). router_logits as in Moe.
  void Route(const TensorView& router, const RouterOptions& opts, const float* x, int64_t n_tokens,
             Routing& routing, float* router_logits);
  CpuExpertExecutor& executor() { return executor_; }
  void SetPhaseTimes(PhaseTimes* times) override;
  PhaseTimes* phase_times() const override { return times_; }
  void SetExpertStats(ExpertStats* stats) override { stats_ = stats; }

  ThreadPool& pool() { return pool_; }

 private:
  // The rows of logits that ArgMaxLogits and TopKLogits read, kept for CopyLogitsRow.
  void KeepLogits(const float* x, int64_t n_rows, const TensorView& lm_head);

  ThreadPool pool_;
  Workspace ws_;
  CpuExpertExecutor executor_;
  PhaseTimes* times_ = nullptr;
  ExpertStats* stats_ = nullptr;
  Routing routing_;  // the current MoE layer's, refilled each call
  int64_t active_experts_ = 0;
  std::vector<int64_t> non_finite_;  // by slot
  std::vector<int32_t> scored_;      // the step's Batch::scored
  std::vector<float> kept_logits_;   // ArgMaxLogits' and TopKLogits' rows, kept between steps
  int64_t kept_vocab_ = 0;           // their length
  std::array<std::vector<float>, static_cast<size_t>(Act::kCount)> acts_;
};

}  // namespace moetier
