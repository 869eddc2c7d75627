#include "experts/locked_prefill.h"

#include <algorithm>

namespace moetier {

namespace {

// Weight of a new observation in the averages.
constexpr double kNewWeight = 0.3;

void Average(std::optional<double>& avg, double v) {
  avg = avg ? (1 - kNewWeight) * *avg + kNewWeight * v : v;
}

}  // namespace

LockedPrefill::Way LockedPrefill::Choose(int64_t n_tokens) {
  if (forced_) return *forced_;
  if (!cpu_ns_per_token_) return Way::kCpu;
  if (!stage_ns_) return Way::kStage;
  const Way cheaper =
      static_cast<double>(n_tokens) * *cpu_ns_per_token_ <= *stage_ns_ ? Way::kCpu : Way::kStage;
  if (preferred_ != cheaper) {  // first decision, or the last retry changed the preference
    preferred_ = cheaper;
    retry_after_ = kRetryAfter;
    steps_since_other_ = 0;
  }
  if (++steps_since_other_ > retry_after_) {
    steps_since_other_ = 0;
    retry_after_ = std::min(2 * retry_after_, kMaxRetryAfter);
    return cheaper == Way::kCpu ? Way::kStage : Way::kCpu;
  }
  return cheaper;
}

void LockedPrefill::ObserveCpu(int64_t n_tokens, double ns) {
  if (n_tokens > 0) Average(cpu_ns_per_token_, ns / static_cast<double>(n_tokens));
}

void LockedPrefill::ObserveStage(double ns) {
  Average(stage_ns_, ns);
}

}  // namespace moetier
