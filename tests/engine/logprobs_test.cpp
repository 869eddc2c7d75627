// LogprobsOf against a direct computation on fresh random rows, and LogprobsOfCandidates (what a
// GPU hands back) against LogprobsOf of the row.
#include "engine/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/cpu/elementwise.h"
#include "support/seed.h"

namespace moetier {
namespace {

// Within 1e-5, or the same infinity.
void ExpectLogprob(float got, double expected) {
  if (std::isinf(expected)) {
    EXPECT_EQ(got, expected);
  } else {
    EXPECT_NEAR(got, expected, 1e-5);
  }
}

TEST(Logprobs, AreTheLogSoftmaxAndTheMostLikelyTokensInOrder) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t V = 2 + rng() % 5000;
    std::normal_distribution<float> logit(0.0f, 1.0f + static_cast<float>(trial));
    std::vector<float> row(V);
    for (float& v : row) v = logit(rng);
    if (V > 10) row[rng() % V] = row[rng() % V];  // a tie
    if (trial % 4 == 3) row[rng() % V] = -std::numeric_limits<float>::infinity();
    const int n_top = static_cast<int>(rng() % (kMaxTopLogprobs + 1));
    const auto token = static_cast<int32_t>(rng() % V);
    const TokenLogprobs lp = LogprobsOf(row, token, n_top);

    double sum = 0;
    for (float v : row) sum += std::exp(static_cast<double>(v));
    const double log_z = std::log(sum);
    EXPECT_EQ(lp.chosen.token, token);
    ExpectLogprob(lp.chosen.logprob, row[static_cast<size_t>(token)] - log_z);
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)];
    });
    ASSERT_EQ(lp.top.size(), std::min(V, static_cast<size_t>(n_top)));
    for (size_t k = 0; k < lp.top.size(); ++k) {
      EXPECT_EQ(lp.top[k].token, order[k]) << "rank " << k;
      ExpectLogprob(lp.top[k].logprob, row[static_cast<size_t>(order[k])] - log_z);
    }
  }
}

TEST(Logprobs, OfAOneHotRowAndOfNoAlternatives) {
  std::vector<float> row(100, -std::numeric_limits<float>::infinity());
  row[42] = 3.0f;
  TokenLogprobs lp = LogprobsOf(row, 42, 3);
  EXPECT_EQ(lp.chosen.logprob, 0.0f);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].token, 42);
  EXPECT_EQ(lp.top[1].token, 0) << "ties at -inf: the lowest ids";
  EXPECT_EQ(lp.top[2].token, 1);
  EXPECT_EQ(lp.top[1].logprob, -std::numeric_limits<float>::infinity());
  lp = LogprobsOf(row, 7, 0);
  EXPECT_TRUE(lp.top.empty());
  EXPECT_EQ(lp.chosen.logprob, -std::numeric_limits<float>::infinity());
  std::fill(row.begin(), row.end(), -std::numeric_limits<float>::infinity());
  lp = LogprobsOf(row, 7, 1);
  EXPECT_EQ(lp.chosen.logprob, -std::numeric_limits<float>::infinity()) << "not NaN";
}

// From a row's candidates and RowLogSum: LogprobsOf's values, the token's logit taken from the
// sum or found among the candidates; nullopt where neither has it, or where the candidates are
// fewer than asked while the row holds more.
TEST(Logprobs, FromCandidatesAreTheRowsWhereTheyHoldTheToken) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const auto V = static_cast<int64_t>(100 + rng() % 5000);
    std::normal_distribution<float> logit(0.0f, 1.0f + static_cast<float>(trial));
    std::vector<float> row(static_cast<size_t>(V));
    for (float& v : row) v = logit(rng);
    std::vector<LogitCandidate> cands(kMaxLogitCandidates);
    const int32_t count = kernels::TopKCandidates(row.data(), V, kMaxCandidateTopK,
                                                  kMaxLogitCandidates, cands.data());
    ASSERT_GE(count, kMaxCandidateTopK);
    cands.resize(static_cast<size_t>(count));
    const int n_top = static_cast<int>(rng() % (kMaxTopLogprobs + 1));
    RowLogSum sum;
    sum.log_sum_exp = kernels::LogSumExp(row.data(), V);
    const int32_t inside = cands[rng() % cands.size()].id;
    int32_t outside = static_cast<int32_t>(rng() % V);
    while (row[static_cast<size_t>(outside)] >= cands.back().logit) outside = (outside + 1) % V;

    auto same = [&](const std::optional<TokenLogprobs>& got, int32_t token) {
      ASSERT_TRUE(got.has_value()) << "token " << token;
      const TokenLogprobs want = LogprobsOf(row, token, n_top);
      EXPECT_EQ(got->chosen.token, token);
      EXPECT_EQ(got->chosen.logprob, want.chosen.logprob);
      ASSERT_EQ(got->top.size(), want.top.size());
      for (size_t k = 0; k < want.top.size(); ++k) {
        EXPECT_EQ(got->top[k].token, want.top[k].token);
        EXPECT_EQ(got->top[k].logprob, want.top[k].logprob);
      }
    };
    same(LogprobsOfCandidates(cands, sum, inside, n_top, V), inside);  // found among them
    EXPECT_FALSE(LogprobsOfCandidates(cands, sum, outside, n_top, V).has_value());
    sum.token = outside;  // the scored token: its logit from the sum
    sum.token_logit = row[static_cast<size_t>(outside)];
    same(LogprobsOfCandidates(cands, sum, outside, n_top, V), outside);
    if (n_top > 1) {
      EXPECT_FALSE(LogprobsOfCandidates(std::span(cands).first(static_cast<size_t>(n_top - 1)), sum,
                                        outside, n_top, V)
                       .has_value());
    }
  }
  // A row shorter than n_top: as many as it holds.
  const std::vector<LogitCandidate> three = {{2.0f, 1}, {1.0f, 0}, {0.5f, 2}};
  const RowLogSum sum{.log_sum_exp = 3.0, .token_logit = 0.0f, .token = -1};
  const auto lp = LogprobsOfCandidates(three, sum, 2, 5, 3);
  ASSERT_TRUE(lp.has_value());
  EXPECT_EQ(lp->top.size(), 3u);
  EXPECT_EQ(lp->chosen.logprob, -2.5f);
}

}  // namespace
}  // namespace moetier
