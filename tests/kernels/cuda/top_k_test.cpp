// The device's top-k candidates of logit rows (kernels/cuda/top_k.h) against
// kernels::TopKCandidates on fresh random rows: real-model-like values, rows of few distinct
// values (ties with the k-th), rows shorter than k, non-finite elements, and values bunched
// into one histogram bin (then -1, never a wrong list).
#include "kernels/cuda/top_k.h"

#include <gtest/gtest.h>

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

enum class Rows { kNormal, kFewValues, kBunched };

std::vector<float> MakeRows(Rows kind, int64_t rows, int64_t n, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(rows * n));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(-20, 20);
  std::uniform_real_distribution<float> tiny(0.0f, 1e-4f);
  for (float& v : x) {
    if (kind == Rows::kNormal) v = normal(rng);
    if (kind == Rows::kFewValues) v = static_cast<float>(small(rng)) * 0.25f;
    if (kind == Rows::kBunched) v = 10.0f + tiny(rng);  // all in one bin: overflows the gather
  }
  return x;
}

struct Result {
  std::vector<LogitCandidate> cands;
  std::vector<int32_t> counts;
  unsigned long long first = 0;
};

Result RunOnDevice(const std::vector<float>& x, int64_t rows, int64_t n, int32_t k) {
  constexpr unsigned long long kNone = ~0ull >> 1;
  const DeviceBuffer<float> d_x = Upload(x);
  auto scratch = DeviceBuffer<uint8_t>::Create(TopKScratchBytes(rows), "scratch").value();
  auto d_cands = DeviceBuffer<LogitCandidate>::Create(
                     static_cast<size_t>(rows * kMaxLogitCandidates), "candidates")
                     .value();
  auto d_counts = DeviceBuffer<int32_t>::Create(static_cast<size_t>(rows), "counts").value();
  DeviceBuffer<unsigned long long> d_first = Upload(std::vector<unsigned long long>{kNone});
  LaunchTopKRows(d_x.data(), rows, n, k, scratch.data(), d_cands.data(), d_counts.data(),
                 d_first.data(), nullptr);
  Result r;
  r.cands = Download(d_cands, static_cast<size_t>(rows * kMaxLogitCandidates));
  r.counts = Download(d_counts, static_cast<size_t>(rows));
  r.first = Download(d_first, 1)[0];
  return r;
}

TEST(CudaTopKRowsTest, CandidatesAreTheCpusAndNonFiniteIsFound) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr unsigned long long kNone = ~0ull >> 1;
  for (const Rows kind : {Rows::kNormal, Rows::kFewValues, Rows::kBunched}) {
    // 300,001: longer than the kernels' largest grid, so a thread takes more than one round.
    for (const int64_t n :
         {int64_t{5}, int64_t{512}, int64_t{32000}, int64_t{151936}, int64_t{300001}}) {
      for (const int64_t rows : {int64_t{1}, int64_t{16}}) {
        for (const int32_t k : {1, 20, kMaxCandidateTopK}) {
          std::vector<float> x = MakeRows(kind, rows, n, rng);
          const bool poison = k == 20;
          if (poison) {  // a NaN first in row 0, an infinity above every value in the last
            x[0] = std::numeric_limits<float>::quiet_NaN();
            x[static_cast<size_t>(rows * n - 1)] = std::numeric_limits<float>::infinity();
          }
          const std::string where = "kind " + std::to_string(static_cast<int>(kind)) + " n " +
                                    std::to_string(n) + " rows " + std::to_string(rows) + " k " +
                                    std::to_string(k);
          const Result got = RunOnDevice(x, rows, n, k);
          int64_t overflowed = 0;
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<LogitCandidate> want(kMaxLogitCandidates);
            const int32_t count =
                kernels::TopKCandidates(x.data() + r * n, n, k, kMaxLogitCandidates, want.data());
            const int32_t got_count = got.counts[static_cast<size_t>(r)];
            if (got_count < 0) {  // allowed only where the values are bunched, or too many tie
              ++overflowed;
              EXPECT_TRUE(kind == Rows::kBunched || count < 0) << where << " row " << r;
              continue;
            }
            ASSERT_EQ(got_count, count) << where << " row " << r;
            for (int32_t i = 0; i < count; ++i) {
              const LogitCandidate& g = got.cands[static_cast<size_t>(r * kMaxLogitCandidates + i)];
              EXPECT_EQ(g.id, want[static_cast<size_t>(i)].id)
                  << where << " row " << r << " #" << i;
              EXPECT_EQ(g.logit, want[static_cast<size_t>(i)].logit) << where << " row " << r;
            }
          }
          // Bunched values of a long row: all in one bin, more than the gather holds.
          if (kind == Rows::kBunched && n > kTopKCollect) {
            EXPECT_EQ(overflowed, rows) << where;
          }
          const int64_t bad = kernels::FirstNonFinite(x.data(), rows * n);
          EXPECT_EQ(got.first, bad < 0 ? kNone : static_cast<unsigned long long>(bad)) << where;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moetier::cuda
