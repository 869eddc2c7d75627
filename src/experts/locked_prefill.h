// Where a long prefill step computes the experts of a layer that is not pinned (a locked or
// pageable bank, run by the CPU executor in decode) when a GPU is present: in place by the CPU
// executor, or copied to the GPU through the pinned staging ring (CPU threads copy the bank
// into pinned chunks that the copy engine streams into the prefill buffers) and computed there
// with the pinned layers' prefill kernels.
//
// The choice is by measured cost, per step of n tokens: the CPU executor's time per token of
// such a layer (it computes every token's experts: time grows with the step) against the ring's
// time per layer (it copies the whole bank whatever the step; the GPU computes one layer while
// the next is staged, so a staged layer costs its copy). Until a way has been observed, steps
// take it; the way not chosen is taken again after kRetryAfter long steps, so that one slow
// first observation (a cold cache, a busy host) does not decide for good, and after twice as
// many each time the retry leaves the preference as it was (up to kMaxRetryAfter): where one way
// is many times the cheaper (on the H200 machine staging a Q4_0 prompt of 4,096 tokens takes
// 0.12 s, the CPU executor 4.5 s), a long-running server pays for the slow way ever more rarely.
//
// Arithmetic only (no CUDA): ExpertOffload (backend/cuda/expert_offload.h) asks and reports.
#pragma once

#include <cstdint>
#include <optional>

namespace moetier {

class LockedPrefill {
 public:
  enum class Way { kCpu, kStage };
  // forced: every long step takes that way (tests, benches: MOETIER_STAGE_LOCKED).
  explicit LockedPrefill(std::optional<Way> forced = std::nullopt) : forced_(forced) {}

  // The way for a long prefill step of n_tokens tokens.
  Way Choose(int64_t n_tokens);
  // A layer computed by the CPU executor over n_tokens tokens in ns nanoseconds.
  void ObserveCpu(int64_t n_tokens, double ns);
  // A layer's bank staged to the GPU in ns nanoseconds.
  void ObserveStage(double ns);

  std::optional<double> cpu_ns_per_token() const { return cpu_ns_per_token_; }
  std::optional<double> stage_ns_per_layer() const { return stage_ns_; }

  static constexpr int64_t kRetryAfter = 16;
  static constexpr int64_t kMaxRetryAfter = 1024;

 private:
  std::optional<Way> forced_;
  std::optional<double> cpu_ns_per_token_, stage_ns_;  // exponential averages
  std::optional<Way> preferred_;                       // the cheaper way at the last long step
  int64_t retry_after_ = kRetryAfter;  // long steps between retries of the other way
  int64_t steps_since_other_ = 0;      // long steps since the way not preferred was taken
};

}  // namespace moetier
