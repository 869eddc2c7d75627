// Tokens drawn on the device (kernels/cuda/draw.h) against a host reference of the same
// definition on fresh random rows: real-model-like logits, flat rows (top-p reaching far down),
// rows of few distinct values (top-p cutting inside a group of ties, which keeps the lowest
// ids), temperature alone, top-p, min-p, both, and a temperature so small that only the largest
// logit weighs. The host's expf may differ from the device's in the last bit, so a token that
// differs from the reference's must lie where that could move it (within 1e-6 of the draw's
// total from a boundary), and such tokens must be rare. Also: the exact distribution over a
// grid of u on a short row, a row's token whatever the other rows, rows without a draw left
// alone, a non-finite logit, and a row's token whatever its slicing into blocks.
#include "kernels/cuda/draw.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/logit_candidate.h"
#include "kernels/cuda/device_buffer.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier::cuda {
namespace {

using moetier::testing::Download;
using moetier::testing::Upload;

constexpr int32_t kUntouched = -7;

struct Drawn {
  std::vector<int32_t> ids;  // -1 where the row was left alone
  std::vector<float> logits;
  unsigned long long first_non_finite = ~0ull;  // the draw's scan of its rows
};

// slices: blocks a row (0: the GPU's choice).
Drawn DrawOnDevice(const std::vector<float>& x, int64_t n, const std::vector<RowDraw>& draws,
                   int slices = 0) {
  const auto rows = static_cast<int64_t>(draws.size());
  const DeviceBuffer<float> d_x = Upload(x);
  const DeviceBuffer<RowDraw> d_draws = Upload(draws);
  auto d_scratch = DeviceBuffer<uint8_t>::Create(DrawScratchBytes(rows), "scratch");
  EXPECT_TRUE(d_scratch.ok()) << d_scratch.status().message();
  DeviceBuffer<LogitCandidate> d_out = Upload(
      std::vector<LogitCandidate>(static_cast<size_t>(rows * kMaxLogitCandidates), {0.0f, -1}));
  DeviceBuffer<int32_t> d_counts =
      Upload(std::vector<int32_t>(static_cast<size_t>(rows), kUntouched));
  DeviceBuffer<unsigned long long> d_first = Upload(std::vector<unsigned long long>{~0ull});
  LaunchDrawRows(d_x.data(), rows, n, d_draws.data(), DrawWorkOf(draws), d_scratch->data(),
                 d_out.data(), d_counts.data(), d_first.data(), nullptr, slices);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<LogitCandidate> out =
      Download(d_out, static_cast<size_t>(rows * kMaxLogitCandidates));
  const std::vector<int32_t> counts = Download(d_counts, static_cast<size_t>(rows));
  Drawn d;
  d.first_non_finite = Download(d_first, 1)[0];
  for (int64_t r = 0; r < rows; ++r) {
    const LogitCandidate c = out[static_cast<size_t>(r * kMaxLogitCandidates)];
    const int32_t count = counts[static_cast<size_t>(r)];
    EXPECT_TRUE(count == 1 || count == kUntouched) << "row " << r << " count " << count;
    d.ids.push_back(count == 1 ? c.id : -1);
    d.logits.push_back(c.logit);
  }
  return d;
}

// The definition of draw.h on the host, with the host's expf.
struct Reference {
  int32_t token = -1;
  bool near_edge = false;  // a last-bit difference in a weight could move the token
};

Reference DrawOnHost(const float* l, int64_t n, const RowDraw& d) {
  constexpr double kEdge = 1e-6;
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(l[i])) max = std::max(max, l[i]);
  std::vector<unsigned long long> W(static_cast<size_t>(n), 0);
  std::vector<float> w(static_cast<size_t>(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    if (!std::isfinite(l[i])) continue;
    if (l[i] == max) {
      w[k] = 1.0f;
    } else {
      const float e = (l[i] - max) * d.inv_temperature;
      if (!(e > -32.0f)) continue;
      w[k] = std::exp(e);
    }
    W[k] = static_cast<unsigned long long>(std::nearbyint(static_cast<double>(w[k]) * 0x1p44));
  }
  Reference ref;
  std::vector<bool> kept(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i) kept[static_cast<size_t>(i)] = W[static_cast<size_t>(i)] != 0;
  const unsigned long long total = std::accumulate(W.begin(), W.end(), 0ull);
  if (d.top_p < 1.0f) {
    std::vector<int32_t> order;
    for (int64_t i = 0; i < n; ++i)
      if (W[static_cast<size_t>(i)] != 0) order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
    const auto need = std::min(
        total, std::max(1ull, static_cast<unsigned long long>(std::ceil(
                                  static_cast<double>(d.top_p) * static_cast<double>(total)))));
    unsigned long long acc = 0;
    size_t j = 0;
    for (; j < order.size(); ++j) {
      acc += W[static_cast<size_t>(order[j])];
      if (acc >= need) break;
    }
    const double tol = kEdge * static_cast<double>(total);
    if (std::fabs(static_cast<double>(acc) - static_cast<double>(need)) < tol ||
        std::fabs(static_cast<double>(acc - W[static_cast<size_t>(order[j])]) -
                  static_cast<double>(need)) < tol)
      ref.near_edge = true;
    for (size_t i = j + 1; i < order.size(); ++i) kept[static_cast<size_t>(order[i])] = false;
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    if (!kept[k] || d.min_p <= 0.0f) continue;
    if (std::fabs(w[k] - d.min_p) <= kEdge * d.min_p) ref.near_edge = true;
    kept[k] = w[k] >= d.min_p;
  }
  unsigned long long sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (kept[static_cast<size_t>(i)]) sum += W[static_cast<size_t>(i)];
  const auto pick = static_cast<unsigned long long>(d.u * static_cast<double>(sum));
  const unsigned long long target = std::min(pick, sum - 1);
  unsigned long long acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i);
    if (!kept[k]) continue;
    const unsigned long long before = acc;
    acc += W[k];
    if (acc > target) {
      ref.token = static_cast<int32_t>(i);
      const double tol = kEdge * static_cast<double>(sum);
      if (static_cast<double>(target - before) < tol || static_cast<double>(acc - target) < tol)
        ref.near_edge = true;
      break;
    }
  }
  return ref;
}

enum class Rows { kNormal, kFlat, kFewValues };

std::vector<float> MakeRows(Rows kind, int64_t rows, int64_t n, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(rows * n));
  std::normal_distribution<float> normal(0.0f, 3.0f), flat(0.0f, 0.1f);
  std::uniform_int_distribution<int> small(-6, 6);
  for (float& v : x) {
    if (kind == Rows::kNormal) v = normal(rng);
    if (kind == Rows::kFlat) v = flat(rng);
    if (kind == Rows::kFewValues) v = static_cast<float>(small(rng)) * 0.5f;
  }
  return x;
}

TEST(CudaDrawRowsTest, TokensAreTheReferencesOnRandomRows) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int64_t draws_made = 0, off_reference = 0;
  for (const Rows kind : {Rows::kNormal, Rows::kFlat, Rows::kFewValues}) {
    for (const int64_t n : {int64_t{5}, int64_t{1001}, int64_t{151936}}) {
      constexpr int64_t kRows = 12;
      const std::vector<float> x = MakeRows(kind, kRows, n, rng);
      std::vector<RowDraw> draws;
      for (int64_t r = 0; r < kRows; ++r) {
        RowDraw d;
        d.u = uniform(rng);
        d.inv_temperature = 1.0f / std::array<float, 3>{0.6f, 1.0f, 1.7f}[r % 3];
        d.top_p = std::array<float, 4>{1.0f, 0.9f, 0.5f, 1.0f}[(r / 3) % 4];
        d.min_p = r % 4 == 3 ? 0.05f : 0.0f;
        draws.push_back(d);
      }
      const Drawn got = DrawOnDevice(x, n, draws);
      for (int64_t r = 0; r < kRows; ++r) {
        const RowDraw& d = draws[static_cast<size_t>(r)];
        const std::string where = "kind " + std::to_string(static_cast<int>(kind)) + " n " +
                                  std::to_string(n) + " row " + std::to_string(r) + " top_p " +
                                  std::to_string(d.top_p) + " min_p " + std::to_string(d.min_p);
        const Reference ref = DrawOnHost(x.data() + r * n, n, d);
        const int32_t id = got.ids[static_cast<size_t>(r)];
        ASSERT_GE(id, 0) << where;
        ASSERT_LT(id, n) << where;
        EXPECT_EQ(got.logits[static_cast<size_t>(r)], x[static_cast<size_t>(r * n + id)]) << where;
        ++draws_made;
        if (id != ref.token) {
          ++off_reference;
          EXPECT_TRUE(ref.near_edge) << where << ": device " << id << ", reference " << ref.token;
        }
      }
    }
  }
  EXPECT_LE(off_reference * 50, draws_made) << off_reference << " of " << draws_made;
}

TEST(CudaDrawRowsTest, AGridOfUniformsGivesTheExactDistribution) {
  MT_REQUIRE_GPU();
  // Weights 1, 1/2, 1/4, ... exactly (logits k * -ln 2 at temperature 1 round to them within
  // a last bit, and W rounds to integers): the share of a grid of u each token gets is its
  // probability, to within one grid step.
  constexpr int64_t n = 6, kGrid = 4096;
  std::vector<float> row(n);
  for (int64_t i = 0; i < n; ++i) row[static_cast<size_t>(i)] = -0.6931472f * static_cast<float>(i);
  std::vector<float> x;
  std::vector<RowDraw> draws;
  for (int64_t g = 0; g < kGrid; ++g) {
    x.insert(x.end(), row.begin(), row.end());
    RowDraw d;
    d.u = (static_cast<double>(g) + 0.5) / kGrid;
    d.top_p = 0.8f;  // 1 + 1/2 + 1/4 = 1.75 of 1.96875: 0.889 >= 0.8, so three tokens
    draws.push_back(d);
  }
  const Drawn got = DrawOnDevice(x, n, draws);
  std::vector<int64_t> hits(n, 0);
  for (int32_t id : got.ids) {
    ASSERT_GE(id, 0);
    ++hits[static_cast<size_t>(id)];
  }
  const double want[3] = {4.0 / 7, 2.0 / 7, 1.0 / 7};
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(static_cast<double>(hits[static_cast<size_t>(i)]) / kGrid, want[i], 1.0 / kGrid)
        << "token " << i;
  for (int64_t i = 3; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)], 0) << "token " << i;
}

TEST(CudaDrawRowsTest, ARowsTokenIsItsOwnWhateverTheOtherRows) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr int64_t n = 32000;
  const std::vector<float> mine = MakeRows(Rows::kNormal, 1, n, rng);
  RowDraw d;
  d.u = 0.37;
  d.inv_temperature = 1.0f / 0.8f;
  d.top_p = 0.95f;
  const int32_t alone = DrawOnDevice(mine, n, {d}).ids[0];
  ASSERT_GE(alone, 0);
  for (const int64_t at : {int64_t{0}, int64_t{5}, int64_t{15}}) {
    std::vector<float> x = MakeRows(Rows::kFlat, 16, n, rng);
    std::copy(mine.begin(), mine.end(), x.begin() + at * n);
    std::vector<RowDraw> draws(16);
    for (size_t r = 0; r < draws.size(); ++r) {
      draws[r].u = r % 2 == 0 ? 0.5 : -1.0;  // odd rows: no draw
      draws[r].top_p = 0.7f;
    }
    draws[static_cast<size_t>(at)] = d;
    const Drawn got = DrawOnDevice(x, n, draws);
    EXPECT_EQ(got.ids[static_cast<size_t>(at)], alone) << "at row " << at;
    for (size_t r = 1; r < draws.size(); r += 2) {
      if (static_cast<int64_t>(r) != at) {
        EXPECT_EQ(got.ids[r], -1) << "row " << r;
      }
    }
  }
}

// A row is drawn by blocks of slices of it, the last to finish walking the slice that holds the
// target: the token is the same however many slices (empty ones too, on short rows), with top-p
// cutting inside a group of ties that spans slices.
TEST(CudaDrawRowsTest, TheSlicingChangesNoToken) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const Rows kind : {Rows::kNormal, Rows::kFlat, Rows::kFewValues}) {
    for (const int64_t n : {int64_t{5}, int64_t{1001}, int64_t{151936}}) {
      constexpr int64_t kRows = 8;
      const std::vector<float> x = MakeRows(kind, kRows, n, rng);
      std::vector<RowDraw> draws(kRows);
      for (int64_t r = 0; r < kRows; ++r) {
        RowDraw& d = draws[static_cast<size_t>(r)];
        d.u = uniform(rng);
        d.inv_temperature = r % 2 == 0 ? 1.0f : 1.0f / 0.6f;
        d.top_p = std::array<float, 4>{1.0f, 0.9f, 0.5f, 0.97f}[r % 4];
        d.min_p = r >= 6 ? 0.05f : 0.0f;
      }
      const std::vector<int32_t> one = DrawOnDevice(x, n, draws, 1).ids;
      for (const int slices : {0, 3, 64, 128, 256}) {
        const std::vector<int32_t> got = DrawOnDevice(x, n, draws, slices).ids;
        for (size_t r = 0; r < one.size(); ++r) {
          ASSERT_GE(one[r], 0);
          EXPECT_EQ(got[r], one[r]) << "kind " << static_cast<int>(kind) << " n " << n << " row "
                                    << r << " slices " << slices;
        }
      }
    }
  }
}

TEST(CudaDrawRowsTest, ATinyTemperatureDrawsAmongTheLargestAndNonFiniteWeighsNothing) {
  MT_REQUIRE_GPU();
  constexpr int64_t n = 4099;
  std::vector<float> x(static_cast<size_t>(3 * n), 0.0f);
  for (int64_t r : {0, 2}) {  // two largest, equally likely
    x[static_cast<size_t>(r * n + 17)] = 3.0f;
    x[static_cast<size_t>(r * n + 40)] = 3.0f;
    x[static_cast<size_t>(r * n + 100)] = std::numeric_limits<float>::quiet_NaN();
  }
  x[static_cast<size_t>(n + 5)] = std::numeric_limits<float>::infinity();
  x[static_cast<size_t>(n + 9)] = 2.0f;
  std::vector<RowDraw> draws(3);
  for (RowDraw& d : draws) d.inv_temperature = std::numeric_limits<float>::infinity();  // 1/1e-40
  draws[0].u = 0.999;
  draws[1].u = 0.999;
  draws[2].u = 0.2;
  const Drawn got = DrawOnDevice(x, n, draws);
  EXPECT_EQ(got.ids[0], 40);
  EXPECT_EQ(got.ids[1], 9);
  EXPECT_EQ(got.ids[2], 17);
}

// A step whose every row is drawn runs no top-k: the draw's scan reports the first non-finite
// logit of its rows (their index in x), whatever the slicing, and nothing from rows not drawn.
TEST(CudaDrawRowsTest, TheDrawReportsItsRowsFirstNonFiniteLogit) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr int64_t n = 151936;
  std::vector<float> x = MakeRows(Rows::kNormal, 3, n, rng);
  std::vector<RowDraw> draws(3);
  for (RowDraw& d : draws) d.u = 0.5;
  for (const int slices : {0, 1, 3, 128})
    EXPECT_EQ(DrawOnDevice(x, n, draws, slices).first_non_finite, ~0ull) << "slices " << slices;
  std::uniform_int_distribution<int64_t> at(0, n - 1);
  const int64_t early = at(rng) % 100, late = at(rng);
  x[static_cast<size_t>(early)] = std::numeric_limits<float>::quiet_NaN();  // row 0: not drawn
  x[static_cast<size_t>(n + late)] = std::numeric_limits<float>::infinity();
  x[static_cast<size_t>(n + std::min(late + 1 + at(rng) % 1000, n - 1))] = -INFINITY;
  x[static_cast<size_t>(2 * n + early)] = std::numeric_limits<float>::quiet_NaN();
  draws[0].u = -1.0;
  for (const int slices : {0, 1, 3, 128})
    EXPECT_EQ(DrawOnDevice(x, n, draws, slices).first_non_finite,
              static_cast<unsigned long long>(n + late))
        << "slices " << slices << " at " << late;
  draws[1].u = -1.0;
  EXPECT_EQ(DrawOnDevice(x, n, draws).first_non_finite,
            static_cast<unsigned long long>(2 * n + early));
}

}  // namespace
}  // namespace moetier::cuda
