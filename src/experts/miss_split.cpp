#include "experts/miss_split.h"

#include <algorithm>
#include <cmath>

namespace moetier {

namespace {

// Starting rates before the first observation, bytes/ns (GB/s): the same for both sides (an
// even split), as neither is known yet; the first split steps measure them.
constexpr double kInitialGbPerS = 25.0;
// Weight of a new observation in the averages: a handful of steps to follow a change (another
// process taking the memory bandwidth) without a single slow step swinging the split.
constexpr double kObservationWeight = 0.2;

// Observations of each side before the averages are kept for later runs: enough for the
// starting guess to have washed out (0.8^16 < 3 % of it left).
constexpr int64_t kObservationsToKeep = 16;

double Average(double old, double observed) {
  observed = std::min(observed, MissSplit::kMaxObservedRatio * old);
  return old + kObservationWeight * (observed - old);
}

}  // namespace

MissSplit::MissSplit(uint64_t expert_bytes, double fixed_fetch_share,
                     std::optional<SplitRates> start)
    : fixed_share_(fixed_fetch_share),
      copy_ns_(static_cast<double>(expert_bytes) / kInitialGbPerS),
      cpu_ns_(static_cast<double>(expert_bytes) / kInitialGbPerS) {
  if (start && start->copy_ns_per_expert > 0 && start->cpu_ns_per_expert > 0) {
    copy_ns_ = start->copy_ns_per_expert;
    cpu_ns_ = start->cpu_ns_per_expert;
  }
}

std::optional<SplitRates> MissSplit::MeasuredRates() const {
  if (fixed_share_ >= 0 || std::min(copy_observations_, cpu_observations_) < kObservationsToKeep)
    return std::nullopt;
  return SplitRates{copy_ns_, cpu_ns_, std::min(copy_observations_, cpu_observations_)};
}

double MissSplit::q_star() const {
  if (fixed_share_ >= 0) return std::min(1.0, fixed_share_);
  return cpu_ns_ / (copy_ns_ + cpu_ns_);  // copy rate / (copy rate + CPU rate)
}

int64_t MissSplit::FetchCount(int64_t n_misses) {
  int64_t n_fetch = BalancedFetchCount(n_misses);
  if (fixed_share_ >= 0 || n_misses < 2) return n_fetch;
  if (n_fetch == n_misses && cpu_explore_ == 0 && ++cpu_idle_ >= kExploreAfter)
    cpu_explore_ = kExploreCalls;
  if (n_fetch == 0 && copy_explore_ == 0 && ++copy_idle_ >= kExploreAfter)
    copy_explore_ = kExploreCalls;
  if (cpu_explore_ > 0) {
    --cpu_explore_;
    n_fetch = std::min(n_fetch, n_misses - 1);
  }
  if (copy_explore_ > 0) {
    --copy_explore_;
    n_fetch = std::max<int64_t>(n_fetch, 1);
  }
  if (n_fetch < n_misses) cpu_idle_ = 0;
  if (n_fetch > 0) copy_idle_ = 0;
  return n_fetch;
}

int64_t MissSplit::BalancedFetchCount(int64_t n_misses) const {
  if (n_misses <= 0) return 0;
  if (fixed_share_ >= 0)
    return std::clamp<int64_t>(std::llround(q_star() * static_cast<double>(n_misses)), 0, n_misses);
  // The balance point lies between floor and ceil of q* x n: take the one finishing sooner.
  const double ideal = q_star() * static_cast<double>(n_misses);
  const auto lo = std::clamp<int64_t>(static_cast<int64_t>(std::floor(ideal)), 0, n_misses);
  const int64_t hi = std::min(lo + 1, n_misses);
  auto finish = [&](int64_t n_fetch) {
    return std::max(static_cast<double>(n_fetch) * copy_ns_,
                    static_cast<double>(n_misses - n_fetch) * cpu_ns_);
  };
  return finish(hi) < finish(lo) ? hi : lo;
}

void MissSplit::ObserveCopies(int64_t experts, double ns) {
  if (experts <= 0 || ns <= 0) return;
  copy_ns_ = Average(copy_ns_, ns / static_cast<double>(experts));
  ++copy_observations_;
}

void MissSplit::ObserveCpu(int64_t experts, double ns) {
  if (experts <= 0 || ns <= 0) return;
  cpu_ns_ = Average(cpu_ns_, ns / static_cast<double>(experts));
  ++cpu_observations_;
}

void ChooseFetched(std::span<MissCandidate> misses, int64_t n_fetch,
                   std::vector<int32_t>& fetched) {
  n_fetch = std::clamp<int64_t>(n_fetch, 0, static_cast<int64_t>(misses.size()));
  std::sort(misses.begin(), misses.end(), [](const MissCandidate& a, const MissCandidate& b) {
    return a.tokens != b.tokens ? a.tokens > b.tokens : a.expert < b.expert;
  });
  fetched.clear();
  for (int64_t i = 0; i < n_fetch; ++i) fetched.push_back(misses[static_cast<size_t>(i)].expert);
  std::sort(fetched.begin(), fetched.end());
}

}  // namespace moetier
