// The CPU's row reductions of kernels/cpu/elementwise.h that greedy sampling and the non-finite
// checks read.
#include "kernels/cpu/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace moetier::kernels {
namespace {

// The greedy pick is the first index of the largest logit, like std::max_element, on vocabulary
// sized inputs with many exact ties (values drawn from a small set).
TEST(ArgMax, FirstIndexOfTheMaximum) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));  // a failure replays with this seed
  std::mt19937 rng(seed);
  for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{33}, size_t{151936}}) {
    std::uniform_int_distribution<int> small(-20, 20);
    std::vector<float> v(n);
    for (int rep = 0; rep < 5; ++rep) {
      for (float& x : v) x = static_cast<float>(small(rng)) * 0.25f;
      const auto want = std::max_element(v.begin(), v.end()) - v.begin();
      ASSERT_EQ(ArgMax(v.data(), static_cast<int64_t>(n)), want) << "n " << n;
      ASSERT_EQ(MaxOf(v.data(), static_cast<int64_t>(n)), v[static_cast<size_t>(want)]);
    }
  }
  EXPECT_EQ(ArgMax(nullptr, 0), 0);
}

// A NaN never wins, wherever it sits (the eight running maxima start from the first element).
TEST(ArgMax, NaNNeverWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(37, -1.0f);
  v[20] = 3.0f;
  for (size_t at : {size_t{0}, size_t{5}, size_t{21}, size_t{36}}) {
    std::vector<float> w = v;
    w[at] = nan;
    EXPECT_EQ(ArgMax(w.data(), static_cast<int64_t>(w.size())), 20) << "NaN at " << at;
  }
  const std::vector<float> all(9, nan);
  EXPECT_EQ(ArgMax(all.data(), static_cast<int64_t>(all.size())), 0);
  // Over many chunks: NaNs before the maximum, and a row of -inf and NaN only.
  std::vector<float> long_row(1000, -2.0f);
  for (size_t i = 0; i < long_row.size(); i += 3) long_row[i] = nan;
  long_row[701] = 5.0f;
  long_row[950] = 5.0f;
  EXPECT_EQ(ArgMax(long_row.data(), static_cast<int64_t>(long_row.size())), 701);
  std::vector<float> low(300, -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < 130; ++i) low[i] = nan;
  EXPECT_EQ(ArgMax(low.data(), static_cast<int64_t>(low.size())), 130);
}

// AnyAtLeast against a plain loop on fresh random rows of every length up to 200, with the
// threshold one of the row's values (>= counts it), just above the largest, and NaNs mixed in.
TEST(AnyAtLeast, MatchesAPlainLoop) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n = 0; n <= 200; ++n) {
    std::vector<float> v(n);
    for (float& x : v) x = rng() % 7 == 0 ? nan : dist(rng);
    const float largest = MaxOf(v.data(), static_cast<int64_t>(n));
    std::vector<float> thresholds = {std::nextafter(largest, 1e30f), 0.0f, -1e30f, nan};
    if (n > 0) thresholds.push_back(v[rng() % n]);
    for (float t : thresholds) {
      bool want = false;
      for (float x : v) want = want || x >= t;
      ASSERT_EQ(AnyAtLeast(v.data(), static_cast<int64_t>(n), t), want) << "n " << n << ", t " << t;
    }
  }
}

// The sampler's weights against exp in long double on fresh random logits, shifts and scales
// (temperatures from 0.05 to 5, and one so small that 1/T overflows float): within 2e-7
// relative where the exact value is a normal float (above e^-87), at most e^-87 below that,
// exactly 1 at the shift.
TEST(ScaledExp, MatchesExpWithinItsTolerance) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> logit(0.0f, 6.0f);
  for (double temperature : {0.05, 0.7, 1.0, 5.0, 1e-40}) {
    const size_t n = 100003;
    std::vector<float> x(n);
    for (float& v : x) v = logit(rng);
    const float shift = MaxOf(x.data(), static_cast<int64_t>(n));
    std::vector<float> y(n);
    ScaledExp(x.data(), static_cast<int64_t>(n), shift, 1.0 / temperature, y.data());
    double worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const long double arg =
          (static_cast<long double>(x[i]) - shift) / static_cast<long double>(temperature);
      const long double want = std::exp(arg);
      if (arg > -87.0L) {
        const double rel = static_cast<double>(std::fabs((y[i] - want) / want));
        worst = std::max(worst, rel);
        ASSERT_LE(rel, 2e-7) << "T " << temperature << " x " << x[i] << " shift " << shift;
      } else {
        ASSERT_LE(y[i], 1.7e-38f) << "T " << temperature << " x " << x[i];
        ASSERT_GE(y[i], 0.0f);
      }
      if (x[i] == shift) {
        ASSERT_EQ(y[i], 1.0f);
      }
    }
    std::printf("T %g: worst relative error %.3g\n", temperature, worst);
  }
}

// LogSumExp against the sum taken in long double, on rows of several lengths (across its
// chunks) and ranges; rows of -inf elements, of -inf only, and empty.
TEST(LogSumExp, IsTheLogOfTheSumOfExponentials) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (size_t n : {size_t{1}, size_t{5}, size_t{1024}, size_t{1025}, size_t{151936}}) {
    for (float scale : {0.5f, 8.0f, 60.0f}) {
      std::normal_distribution<float> logit(-3.0f, scale);
      std::vector<float> x(n);
      for (float& v : x) v = logit(rng);
      if (n > 1) x[n / 2] = -kInf;  // a banned token
      long double max = -INFINITY, sum = 0;
      for (float v : x) max = std::max(max, static_cast<long double>(v));
      for (float v : x) sum += std::exp(static_cast<long double>(v) - max);
      const double want = static_cast<double>(max + std::log(sum));
      EXPECT_NEAR(LogSumExp(x.data(), static_cast<int64_t>(n)), want, 4e-7)
          << "n " << n << " scale " << scale;
    }
  }
  const std::vector<float> banned(9, -kInf);
  EXPECT_EQ(LogSumExp(banned.data(), 9), -kInf);
  EXPECT_EQ(LogSumExp(banned.data(), 0), -kInf);
  const std::vector<float> one = {-kInf, 3.5f, -kInf};
  EXPECT_DOUBLE_EQ(LogSumExp(one.data(), 3), 3.5);
}

}  // namespace
}  // namespace moetier::kernels
