// The hybrid backend's split of a step's expert-cache misses (--moe-backend hybrid): per pinned
// layer and step, the misses the copy engine fetches into the VRAM cache (computed there, with
// the hits) and those the CPU executor computes in place at the same time. Both sides take time
// per expert — the copy engine its bytes over PCIe, the CPU its bytes from RAM — so the step is
// done when the slower side is: the split balances their predicted times. With equal-sized
// experts that is a share q* = copy rate / (copy rate + CPU rate) of the misses for the copy
// engine, each rate the one measured while both run (each observation contended by the other
// side), an exponential average refined from every split step.
//
// Which misses go where is ChooseFetched's rule; this file is arithmetic only (no CUDA).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "experts/split_profile.h"

namespace moetier {

class MissSplit {
 public:
  // expert_bytes: one expert's bytes. fixed_fetch_share in [0, 1] forces q* (tests, benches);
  // negative: measured, starting from `start` (an earlier run's, split_profile.h) when given,
  // else from an even split.
  MissSplit(uint64_t expert_bytes, double fixed_fetch_share,
            std::optional<SplitRates> start = std::nullopt);

  // The share of the misses the copy engine takes now.
  double q_star() const;
  // Of n_misses, how many to fetch: the count whose predicted copy and CPU times are closest to
  // balanced (the smaller of the two maxima), or round(q* x n_misses) when q* is fixed. A side
  // that this rule has left idle for kExploreAfter calls with 2+ misses gets one of them in each
  // of the next kExploreCalls such calls, so its rate stays measured: a rate observed at its
  // worst would otherwise keep it idle for good, and be kept for the next run. Several calls in
  // a row, as an idle CPU's first job pays for waking its threads (the backend leaves that
  // observation out); the ones after it run as they would in use.
  int64_t FetchCount(int64_t n_misses);
  static constexpr int64_t kExploreAfter = 32;
  static constexpr int64_t kExploreCalls = 8;

  // A layer's observed side: `experts` experts in `ns` nanoseconds (copy engine: first copy's
  // start to last copy's end; CPU: the executor's wall time). An observation counts for at most
  // kMaxObservedRatio times the current average: one stalled call (the host preempted a
  // thread) must not swing the split, while a side that really slows still moves it within a
  // few calls.
  void ObserveCopies(int64_t experts, double ns);
  void ObserveCpu(int64_t experts, double ns);
  static constexpr double kMaxObservedRatio = 4.0;
  double copy_ns_per_expert() const { return copy_ns_; }
  double cpu_ns_per_expert() const { return cpu_ns_; }
  // The averages, worth keeping for a later run once both sides were observed often enough
  // (nullopt before, and when q* is forced).
  std::optional<SplitRates> MeasuredRates() const;

 private:
  int64_t BalancedFetchCount(int64_t n_misses) const;

  double fixed_share_;
  double copy_ns_, cpu_ns_;                     // exponential averages, per expert
  int64_t copy_idle_ = 0, cpu_idle_ = 0;        // FetchCount calls that left each side nothing
  int64_t copy_explore_ = 0, cpu_explore_ = 0;  // calls left in each side's exploration
  int64_t copy_observations_ = 0, cpu_observations_ = 0;
};

// One miss of a step: the expert and how many of the step's tokens chose it.
struct MissCandidate {
  int32_t expert = 0;
  int32_t tokens = 0;
};

// The rule for which misses to fetch: the n_fetch with the most tokens (ties: lower id). An
// expert with many tokens gains most from the GPU's compute, and the CPU executor's time grows
// with tokens while a copy's does not. `fetched` gets their ids, ascending; `misses` is
// reordered.
void ChooseFetched(std::span<MissCandidate> misses, int64_t n_fetch, std::vector<int32_t>& fetched);

}  // namespace moetier
