// --moe-collect-stats' counters: per MoE layer sums, unknown layers ignored, the JSON totals.
#include "experts/expert_stats.h"

#include <gtest/gtest.h>

namespace moetier {
namespace {

TEST(ExpertStats, SumsPerLayerAndIgnoresOtherLayers) {
  ExpertStats stats({1, 3});
  LayerExpertStats d;
  d.layer = 3;
  d.calls = 1;
  d.active_experts = 5;
  d.cpu_experts = 2;
  d.gpu_experts = 3;
  d.cache_hits = 1;
  d.cache_misses = 2;
  d.bytes_h2d = 100;
  stats.Add(d);
  stats.Add(d);
  d.layer = 0;  // a dense layer
  stats.Add(d);
  d.layer = 9;  // no such layer
  stats.Add(d);
  const auto s = stats.Snapshot();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].layer, 1);
  EXPECT_EQ(s[0].calls, 0);
  EXPECT_EQ(s[1].layer, 3);
  EXPECT_EQ(s[1].calls, 2);
  EXPECT_EQ(s[1].active_experts, 10);
  EXPECT_EQ(s[1].bytes_h2d, 200);

  const auto j = ExpertStatsJson(s);
  EXPECT_EQ(j["totals"]["active_experts"].get<int64_t>(), 10);
  EXPECT_DOUBLE_EQ(j["totals"]["cache_hit_rate"].get<double>(), 2.0 / 6.0);
  EXPECT_NE(ExpertStatsSummary(s).find("40% computed on the CPU"), std::string::npos)
      << ExpertStatsSummary(s);
}

}  // namespace
}  // namespace moetier
