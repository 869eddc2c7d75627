// The choice between the CPU executor and the staging ring for a locked layer's prefill: each
// way is tried until observed, then the cheaper for the step's size, the other retried ever more
// rarely while it stays the dearer; a forced way is always taken.
#include "experts/locked_prefill.h"

#include <gtest/gtest.h>

#include <vector>

namespace moetier {
namespace {

using Way = LockedPrefill::Way;

TEST(LockedPrefill, TriesEachWayThenTakesTheCheaperForTheStepSize) {
  LockedPrefill p;
  EXPECT_EQ(p.Choose(1000), Way::kCpu) << "nothing observed: the CPU first";
  p.ObserveCpu(1000, 20e6);  // 20 µs a token
  EXPECT_EQ(p.Choose(1000), Way::kStage) << "the ring not observed yet";
  p.ObserveStage(10e6);                    // 10 ms a layer
  EXPECT_EQ(p.Choose(4000), Way::kStage);  // 80 ms on the CPU
  EXPECT_EQ(p.Choose(400), Way::kCpu);     // 8 ms on the CPU
  ASSERT_TRUE(p.cpu_ns_per_token().has_value());
  EXPECT_DOUBLE_EQ(*p.cpu_ns_per_token(), 20e3);
}

// The steps (1-based) among the next n long steps of 4,000 tokens that take the CPU.
std::vector<int64_t> CpuSteps(LockedPrefill& p, int64_t n) {
  std::vector<int64_t> steps;
  for (int64_t i = 1; i <= n; ++i)
    if (p.Choose(4000) == Way::kCpu) steps.push_back(i);
  return steps;
}

TEST(LockedPrefill, RetriesTheOtherWayAfterAWhile) {
  LockedPrefill p;
  p.ObserveCpu(100, 100e6);  // 1 ms a token: a cold first observation
  p.ObserveStage(10e6);
  const int64_t k = LockedPrefill::kRetryAfter;
  // Retries after k, then 2k, then 4k steps while they leave the ring the cheaper.
  EXPECT_EQ(CpuSteps(p, 7 * k + 3), (std::vector<int64_t>{k + 1, 3 * k + 2, 7 * k + 3}));
  p.ObserveCpu(4000, 4e6);  // 1 µs a token once warm: the average moves toward it
  EXPECT_LT(*p.cpu_ns_per_token(), 1e6);
}

TEST(LockedPrefill, RetriesAtMostEveryMaxRetryAfterAndAgainSoonAfterAFlip) {
  LockedPrefill p;
  p.ObserveCpu(4000, 4e9);  // the CPU 100x the ring, for good
  p.ObserveStage(10e6);
  const std::vector<int64_t> cpu = CpuSteps(p, 20 * LockedPrefill::kMaxRetryAfter);
  ASSERT_GE(cpu.size(), 3u);
  for (size_t i = 1; i < cpu.size(); ++i)
    EXPECT_LE(cpu[i] - cpu[i - 1], LockedPrefill::kMaxRetryAfter + 1) << "retry " << i;
  EXPECT_EQ(cpu.back() - cpu[cpu.size() - 2], LockedPrefill::kMaxRetryAfter + 1);
  // The CPU turns out the cheaper: it is preferred, and the ring retried after kRetryAfter.
  for (int i = 0; i < 30; ++i) p.ObserveCpu(4000, 1e6);
  int64_t first_stage = 0;
  for (int64_t i = 1; i <= 2 * LockedPrefill::kRetryAfter && first_stage == 0; ++i)
    if (p.Choose(4000) == Way::kStage) first_stage = i;
  EXPECT_EQ(first_stage, LockedPrefill::kRetryAfter + 1);
}

TEST(LockedPrefill, AForcedWayIsAlwaysTaken) {
  LockedPrefill stage(Way::kStage), cpu(Way::kCpu);
  cpu.ObserveCpu(10, 1e9);
  cpu.ObserveStage(1);
  for (int64_t n : {1, 100, 100000}) {
    EXPECT_EQ(stage.Choose(n), Way::kStage);
    EXPECT_EQ(cpu.Choose(n), Way::kCpu);
  }
}

}  // namespace
}  // namespace moetier
