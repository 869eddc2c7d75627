// The hybrid split's arithmetic: q* from the observed rates, the count that balances both sides,
// a forced share, and which misses are fetched; the rates kept between runs (split_profile.h).
#include "experts/miss_split.h"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "experts/split_profile.h"
#include "support/test_support.h"

namespace moetier {
namespace {

constexpr uint64_t kExpertBytes = 9'437'184;  // a Qwen3-30B-A3B expert in bf16

// Feeds `n` identical observations: the averages converge to them.
void Observe(MissSplit& s, double copy_ns, double cpu_ns, int n = 100) {
  for (int i = 0; i < n; ++i) {
    s.ObserveCopies(3, 3 * copy_ns);
    s.ObserveCpu(5, 5 * cpu_ns);
  }
}

TEST(MissSplit, StartsEvenThenFollowsTheMeasuredRates) {
  MissSplit s(kExpertBytes, -1);
  EXPECT_DOUBLE_EQ(s.q_star(), 0.5);
  // Copies at 55 GB/s, the CPU at 90 GB/s: q* = 55 / 145.
  Observe(s, kExpertBytes / 55.0, kExpertBytes / 90.0);
  EXPECT_NEAR(s.q_star(), 55.0 / 145.0, 1e-6);
  EXPECT_NEAR(s.copy_ns_per_expert(), kExpertBytes / 55.0, 1e-3);
  // The CPU slows (another process reads memory): the split moves to the copy engine.
  Observe(s, kExpertBytes / 55.0, kExpertBytes / 20.0);
  EXPECT_NEAR(s.q_star(), 55.0 / 75.0, 1e-6);
}

TEST(MissSplit, OneObservationMovesTheAverageOnlyPartly) {
  MissSplit s(kExpertBytes, -1);
  const double before = s.cpu_ns_per_expert();
  s.ObserveCpu(1, 100 * before);  // one very slow step
  EXPECT_GT(s.cpu_ns_per_expert(), before);
  EXPECT_LT(s.cpu_ns_per_expert(), 50 * before);
  s.ObserveCpu(0, 1.0);  // nothing computed: no observation
  s.ObserveCopies(4, 0.0);
  EXPECT_DOUBLE_EQ(s.copy_ns_per_expert(), kExpertBytes / 25.0);
}

TEST(MissSplit, FetchCountBalancesThePredictedTimes) {
  MissSplit s(kExpertBytes, -1);
  Observe(s, 2.0, 1.0);  // the CPU twice as fast per expert: q* = 1/3
  EXPECT_EQ(s.FetchCount(0), 0);
  EXPECT_EQ(s.FetchCount(3), 1);  // 1 copy (2) vs 2 on the CPU (2)
  EXPECT_EQ(s.FetchCount(6), 2);
  // 4 misses: fetching 1 finishes at max(2, 3) = 3, fetching 2 at max(4, 2) = 4.
  EXPECT_EQ(s.FetchCount(4), 1);
  // 1 miss: the CPU (1) before a copy (2).
  EXPECT_EQ(s.FetchCount(1), 0);
  for (int64_t n = 0; n < 40; ++n) {
    const int64_t f = s.FetchCount(n);
    ASSERT_GE(f, 0);
    ASSERT_LE(f, n);
    // No other count finishes sooner.
    auto finish = [&](int64_t k) { return std::max(2.0 * k, 1.0 * (n - k)); };
    for (int64_t k = 0; k <= n; ++k) ASSERT_LE(finish(f), finish(k)) << n << " misses";
  }
}

// A side the balance leaves idle gets one miss in each of kExploreCalls calls (of 2+ misses)
// after kExploreAfter calls without any, again and again, so a rate measured at its worst can
// recover; calls of one miss are never split.
TEST(MissSplit, AnIdleSideIsTriedAgainForSeveralCalls) {
  for (bool cpu_slow : {true, false}) {
    MissSplit s(kExpertBytes, -1);
    if (cpu_slow)
      Observe(s, 1.0, 50.0);
    else
      Observe(s, 50.0, 1.0);
    const int64_t all_to_fast = cpu_slow ? 3 : 0;
    const int64_t explored = cpu_slow ? 2 : 1;
    // The kExploreAfter-th idle call is the first of the exploration.
    const int64_t period = MissSplit::kExploreAfter - 1 + MissSplit::kExploreCalls;
    for (int64_t call = 0; call < 3 * period; ++call) {
      const bool exploring = call % period >= MissSplit::kExploreAfter - 1;
      ASSERT_EQ(s.FetchCount(3), exploring ? explored : all_to_fast) << "call " << call;
      ASSERT_EQ(s.FetchCount(1), cpu_slow ? 1 : 0) << "call " << call;
    }
  }
}

// One stalled call (a thread preempted) counts for at most kMaxObservedRatio times the
// average; a side that really slows is followed within a few calls.
TEST(MissSplit, OneStalledCallMovesTheSplitLittle) {
  MissSplit s(kExpertBytes, -1);
  Observe(s, 50.0, 30.0);
  const double q = s.q_star();
  s.ObserveCpu(1, 30.0 * 1000);
  EXPECT_GT(s.cpu_ns_per_expert(), 30.0);
  EXPECT_LT(s.cpu_ns_per_expert(), 2 * 30.0);  // the cap times the weight of one observation
  EXPECT_LT(s.q_star(), q + 0.15);
  for (int i = 0; i < 30; ++i) s.ObserveCpu(2, 2 * 90.0);  // three times slower, for good
  EXPECT_NEAR(s.cpu_ns_per_expert(), 90.0, 0.5);
}

TEST(MissSplit, AForcedShareIgnoresTheRates) {
  for (double share : {0.0, 0.25, 1.0}) {
    MissSplit s(kExpertBytes, share);
    Observe(s, 1.0, 100.0);
    EXPECT_DOUBLE_EQ(s.q_star(), share);
    EXPECT_EQ(s.FetchCount(8), static_cast<int64_t>(share * 8));
  }
}

TEST(ChooseFetched, TakesTheExpertsWithMostTokensLowerIdsFirst) {
  std::vector<MissCandidate> misses = {{7, 1}, {3, 2}, {9, 4}, {1, 1}, {5, 2}};
  std::vector<int32_t> fetched;
  ChooseFetched(misses, 3, fetched);
  EXPECT_EQ(fetched, (std::vector<int32_t>{3, 5, 9}));  // 4 tokens, then 2 and 2
  ChooseFetched(misses, 4, fetched);
  EXPECT_EQ(fetched, (std::vector<int32_t>{1, 3, 5, 9}));  // of the 1-token ones, id 1 first
  ChooseFetched(misses, 0, fetched);
  EXPECT_TRUE(fetched.empty());
  ChooseFetched(misses, 99, fetched);
  EXPECT_EQ(fetched.size(), misses.size());
}

// A later run starts where an earlier one's averages ended, once both sides were observed often
// enough for the even guess to have washed out; a forced share keeps nothing.
TEST(MissSplit, StartsFromKeptRatesAndKeepsItsOwn) {
  MissSplit first(kExpertBytes, -1);
  EXPECT_FALSE(first.MeasuredRates());
  Observe(first, kExpertBytes / 55.0, kExpertBytes / 90.0, 15);
  EXPECT_FALSE(first.MeasuredRates()) << "15 observations of each side";
  Observe(first, kExpertBytes / 55.0, kExpertBytes / 90.0, 1);
  const std::optional<SplitRates> kept = first.MeasuredRates();
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept->split_steps, 16);
  EXPECT_DOUBLE_EQ(kept->copy_ns_per_expert, first.copy_ns_per_expert());

  MissSplit second(kExpertBytes, -1, kept);
  EXPECT_DOUBLE_EQ(second.q_star(), first.q_star());
  EXPECT_NE(second.q_star(), 0.5);
  MissSplit forced(kExpertBytes, 0.25, kept);
  EXPECT_DOUBLE_EQ(forced.q_star(), 0.25);
  Observe(forced, 1.0, 2.0, 20);
  EXPECT_FALSE(forced.MeasuredRates());
}

TEST(SplitProfile, KeepsEachKeysRatesInOneFile) {
  testing::TempDir dir;
  const auto file = dir.path() / "sub" / "hybrid-split.json";
  const std::string h200 = SplitProfileKey("NVIDIA H200", "Q4_0", 1769472, 16);
  const std::string other = SplitProfileKey("NVIDIA H200", "BF16", 9437184, 16);
  auto none = LoadSplitRates(file, h200);
  ASSERT_TRUE(none.ok()) << none.message();
  EXPECT_FALSE(*none) << "no file yet";
  ASSERT_TRUE(SaveSplitRates(file, h200, SplitRates{38000, 19500, 240}).ok());
  ASSERT_TRUE(SaveSplitRates(file, other, SplitRates{170000, 105000, 64}).ok());
  auto got = LoadSplitRates(file, h200);
  ASSERT_TRUE(got.ok() && *got) << got.message();
  EXPECT_DOUBLE_EQ((*got)->copy_ns_per_expert, 38000);
  EXPECT_DOUBLE_EQ((*got)->cpu_ns_per_expert, 19500);
  EXPECT_EQ((*got)->split_steps, 240);
  got = LoadSplitRates(file, other);
  ASSERT_TRUE(got.ok() && *got);
  EXPECT_DOUBLE_EQ((*got)->cpu_ns_per_expert, 105000);
  got = LoadSplitRates(file, SplitProfileKey("NVIDIA H100", "Q4_0", 1769472, 16));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got) << "another GPU's key";
}

TEST(SplitProfile, ABrokenFileIsReportedThenReplaced) {
  testing::TempDir dir;
  const auto file = dir.path() / "hybrid-split.json";
  const std::string key = SplitProfileKey("GPU", "BF16", 100, 2);
  for (const char* text :
       {"{\"GPU", "[1, 2]",
        "{\"GPU | BF16 | 100 B/expert | 2 threads\": {\"copy_ns_per_expert\": -3, "
        "\"cpu_ns_per_expert\": 1}}"}) {
    std::ofstream(file) << text;
    auto r = LoadSplitRates(file, key);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.message().find(file.string()), std::string::npos) << r.message();
  }
  ASSERT_TRUE(SaveSplitRates(file, key, SplitRates{1, 2, 3}).ok());
  auto r = LoadSplitRates(file, key);
  ASSERT_TRUE(r.ok() && *r) << r.message();
  EXPECT_DOUBLE_EQ((*r)->cpu_ns_per_expert, 2);
}

}  // namespace
}  // namespace moetier
