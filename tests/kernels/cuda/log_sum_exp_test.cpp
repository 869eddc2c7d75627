// The device's log-sum-exp of logit rows (kernels/cuda/log_sum_exp.h) against
// kernels::LogSumExp on fresh random rows: real-model-like values, rows of wide range, a row
// with -inf elements (a banned token), a row of -inf only, and the token logits it gathers.
#include "kernels/cuda/log_sum_exp.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/logit_candidate.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/device_buffer.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier::cuda {
namespace {

using moetier::testing::Download;
using moetier::testing::Upload;

// expf's terms within 2 ulp, summed in double either way: the logs agree within a few 1e-7.
constexpr double kTolerance = 1e-6;

TEST(CudaLogSumExpRowsTest, IsTheCpusAndGathersTheTokensLogits) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{151936}}) {
    for (const float scale : {1.0f, 30.0f}) {
      constexpr int64_t kRows = 6;
      std::normal_distribution<float> normal(2.0f, scale);
      std::vector<float> x(static_cast<size_t>(kRows * n));
      for (float& v : x) v = normal(rng);
      for (int64_t i = 0; i < n; i += 3) x[static_cast<size_t>(2 * n + i)] = -kInf;
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(3 * n + i)] = -kInf;
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n - 1));
      // Row 4 names no token, row 5 one outside the row.
      std::vector<int32_t> tokens = {pick(rng), pick(rng), pick(rng),
                                     pick(rng), -1,        static_cast<int32_t>(n)};
      const DeviceBuffer<float> d_x = Upload(x);
      const DeviceBuffer<int32_t> d_tokens = Upload(tokens);
      auto d_out = DeviceBuffer<RowLogSum>::Create(kRows, "sums").value();
      for (const bool named : {true, false}) {
        const std::string where = "n " + std::to_string(n) + " scale " + std::to_string(scale) +
                                  (named ? " tokens" : " no tokens");
        LaunchLogSumExpRows(d_x.data(), kRows, n, named ? d_tokens.data() : nullptr, d_out.data(),
                            nullptr);
        const std::vector<RowLogSum> got = Download(d_out, kRows);
        for (int64_t r = 0; r < kRows; ++r) {
          const RowLogSum& g = got[static_cast<size_t>(r)];
          const float* row = x.data() + r * n;
          const double want = kernels::LogSumExp(row, n);
          if (std::isinf(want)) {
            EXPECT_EQ(g.log_sum_exp, want) << where << " row " << r;
          } else {
            EXPECT_NEAR(g.log_sum_exp, want, kTolerance) << where << " row " << r;
          }
          const int32_t t = tokens[static_cast<size_t>(r)];
          if (named && t >= 0 && t < n) {
            EXPECT_EQ(g.token, t) << where << " row " << r;
            EXPECT_EQ(std::bit_cast<uint32_t>(g.token_logit), std::bit_cast<uint32_t>(row[t]))
                << where << " row " << r;
          } else {
            EXPECT_EQ(g.token, -1) << where << " row " << r;
            EXPECT_TRUE(std::isnan(g.token_logit)) << where << " row " << r;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moetier::cuda
