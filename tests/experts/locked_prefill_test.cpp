// The choice between the CPU executor and the staging ring for a locked layer's prefill: each
// way is tried until observed, then the cheaper for the step's size, the other retried now and
// then; a forced way is always taken.
#include "experts/locked_prefill.h"

#include <gtest/gtest.h>

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

TEST(LockedPrefill, RetriesTheOtherWayAfterAWhile) {
  LockedPrefill p;
  p.ObserveCpu(100, 100e6);  // 1 ms a token: a cold first observation
  p.ObserveStage(10e6);
  int cpu_steps = 0;
  for (int64_t i = 0; i < 2 * LockedPrefill::kRetryAfter + 2; ++i)
    if (p.Choose(4000) == Way::kCpu) ++cpu_steps;
  EXPECT_EQ(cpu_steps, 2);
  p.ObserveCpu(4000, 4e6);  // 1 µs a token once warm: the average moves toward it
  EXPECT_LT(*p.cpu_ns_per_token(), 1e6);
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
