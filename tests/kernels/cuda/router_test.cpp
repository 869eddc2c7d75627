// The router's top-k and the grouping by expert on the device (kernels/cuda/router.h) against
// SoftmaxRow + SelectTopK and Routing::Group (experts/routing.h) on fresh random inputs.
#include "kernels/cuda/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "experts/routing.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/device_buffer.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier::cuda {
namespace {

using moetier::testing::Upload;

template <typename T>
DeviceBuffer<T> Scratch(size_t n) {
  return DeviceBuffer<T>::Create(n + 1, "test output").value();
}

template <typename T>
std::vector<T> Download(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Logits [n_tokens, n_experts] whose top_k + 1 largest are far apart (each e^0.5 times the next
// probability, so float rounding cannot reorder them) and, when `ties`, with two of the chosen
// experts sharing one logit exactly (equal probabilities on both sides: the lower id first).
std::vector<float> MakeLogits(int64_t n_tokens, int64_t n_experts, int64_t top_k, bool ties,
                              std::mt19937& rng) {
  std::uniform_real_distribution<float> low(-12.0f, -8.0f);  // below every top logit
  std::vector<float> logits(static_cast<size_t>(n_tokens * n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = logits.data() + t * n_experts;
    for (int64_t e = 0; e < n_experts; ++e) row[e] = low(rng);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int64_t n_top = std::min(top_k + 1, n_experts);
    for (int64_t j = 0; j < n_top; ++j)
      row[order[static_cast<size_t>(j)]] = 4.0f - 0.5f * static_cast<float>(j);
    if (ties && top_k >= 2) row[order[1]] = row[order[0]];
  }
  return logits;
}

struct TopKCase {
  int64_t n_tokens, n_experts, top_k;
};

TEST(CudaTopKTest, MatchesSoftmaxAndSelectTopK) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const std::vector<TopKCase> cases = {{1, 8, 2},    {3, 64, 8},    {64, 128, 8}, {700, 37, 5},
                                       {1, 512, 16}, {33, 512, 10}, {17, 16, 16}, {5, 256, 1}};
  for (const TopKCase& c : cases) {
    for (bool normalize : {true, false}) {
      for (bool ties : {false, true}) {
        const std::vector<float> logits = MakeLogits(c.n_tokens, c.n_experts, c.top_k, ties, rng);
        const size_t n_out = static_cast<size_t>(c.n_tokens * c.top_k);
        const DeviceBuffer<float> d_logits = Upload(logits);
        DeviceBuffer<int32_t> d_ids = Scratch<int32_t>(n_out);
        DeviceBuffer<float> d_w = Scratch<float>(n_out);
        LaunchTopK(d_logits.data(), c.n_tokens, c.n_experts, c.top_k, normalize, d_ids.data(),
                   d_w.data(), nullptr);
        const std::vector<int32_t> ids = Download(d_ids.data(), n_out);
        const std::vector<float> w = Download(d_w.data(), n_out);

        std::vector<float> probs = logits;
        for (int64_t t = 0; t < c.n_tokens; ++t)
          kernels::SoftmaxRow(probs.data() + t * c.n_experts, c.n_experts);
        std::vector<int32_t> want_ids(n_out);
        std::vector<float> want_w(n_out);
        SelectTopK(probs.data(), c.n_tokens, RouterOptions{c.n_experts, c.top_k, normalize},
                   want_ids.data(), want_w.data());
        for (size_t i = 0; i < n_out; ++i) {
          ASSERT_EQ(ids[i], want_ids[i]) << "E " << c.n_experts << " K " << c.top_k << " T "
                                         << c.n_tokens << " ties " << ties << " at " << i;
          // expf is within 2 ulp of the CPU's exp and the sums (double) differ in order only:
          // probabilities (and their ratios) agree to a few ulp.
          ASSERT_NEAR(w[i], want_w[i], 2e-6f * want_w[i] + 1e-12f) << "at " << i;
        }
      }
    }
  }
}

// Each token's top_k distinct experts, skewed towards low ids (some experts busy, some idle),
// and random weights.
void MakeChoices(int64_t n_tokens, int64_t top_k, int64_t n_experts, std::mt19937& rng,
                 std::vector<int32_t>& ids, std::vector<float>& weights) {
  std::exponential_distribution<double> skew(4.0 / static_cast<double>(n_experts));
  std::uniform_real_distribution<float> wdist(0.0f, 1.0f);
  ids.assign(static_cast<size_t>(n_tokens * top_k), 0);
  weights.assign(ids.size(), 0.0f);
  for (int64_t t = 0; t < n_tokens; ++t) {
    int32_t* row = ids.data() + t * top_k;
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t e;
      do {
        e = static_cast<int32_t>(std::min<double>(skew(rng), static_cast<double>(n_experts - 1)));
      } while (std::find(row, row + j, e) != row + j);
      row[j] = e;
      weights[static_cast<size_t>(t * top_k + j)] = wdist(rng);
    }
  }
}

struct GroupCase {
  int64_t n_tokens, top_k, n_experts;
};

TEST(CudaGroupByExpertTest, EqualsRoutingGroup) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const std::vector<GroupCase> cases = {
      {1, 8, 128},     {3, 2, 8},       {64, 8, 128},   {65, 1, 64}, {700, 8, 512},
      {16384, 8, 128}, {16384, 8, 512}, {300, 8, 4096}, {0, 8, 128}, {1000, 16, 33}};
  for (const GroupCase& c : cases) {
    std::vector<int32_t> ids;
    std::vector<float> weights;
    MakeChoices(c.n_tokens, c.top_k, c.n_experts, rng, ids, weights);
    const size_t n_assign = ids.size();

    const DeviceBuffer<int32_t> d_ids = Upload(ids);
    const DeviceBuffer<float> d_weights = Upload(weights);
    DeviceBuffer<int32_t> d_n_active = Scratch<int32_t>(1);
    DeviceBuffer<int32_t> d_experts = Scratch<int32_t>(static_cast<size_t>(c.n_experts));
    DeviceBuffer<int32_t> d_begin = Scratch<int32_t>(static_cast<size_t>(c.n_experts + 1));
    DeviceBuffer<int32_t> d_token_of = Scratch<int32_t>(n_assign);
    DeviceBuffer<float> d_weight_of = Scratch<float>(n_assign);
    DeviceBuffer<int32_t> d_assign_of = Scratch<int32_t>(n_assign);
    DeviceRouting r;
    r.n_tokens = c.n_tokens;
    r.top_k = c.top_k;
    r.n_experts = c.n_experts;
    r.n_active = d_n_active.data();
    r.experts = d_experts.data();
    r.begin = d_begin.data();
    r.token_of = d_token_of.data();
    r.weight_of = d_weight_of.data();
    r.assign_of = d_assign_of.data();
    LaunchGroupByExpert(d_ids.data(), d_weights.data(), r, nullptr);

    Routing want;
    std::vector<int32_t> start;
    want.Group(ids.data(), weights.data(), c.n_tokens, c.top_k, c.n_experts, start);
    const auto n_active = static_cast<size_t>(Download(d_n_active.data(), 1)[0]);
    const std::string where = "T " + std::to_string(c.n_tokens) + " K " + std::to_string(c.top_k) +
                              " E " + std::to_string(c.n_experts);
    ASSERT_EQ(n_active, want.n_active()) << where;
    // The same counting sort: every array equal, weights bit for bit.
    EXPECT_EQ(Download(d_experts.data(), n_active), want.experts) << where;
    EXPECT_EQ(Download(d_begin.data(), n_active + 1), want.begin) << where;
    EXPECT_EQ(Download(d_token_of.data(), n_assign), want.token_of) << where;
    EXPECT_EQ(Download(d_weight_of.data(), n_assign), want.weight_of) << where;

    // assign_of from the CPU's grouping: walking the experts in ascending order, each token
    // meets its assignments experts ascending.
    std::vector<int32_t> want_assign(n_assign, -1);
    std::vector<int64_t> filled(static_cast<size_t>(c.n_tokens), 0);
    for (size_t a = 0; a < want.n_active(); ++a) {
      for (int32_t pos = want.begin[a]; pos < want.begin[a + 1]; ++pos) {
        const int32_t t = want.token_of[static_cast<size_t>(pos)];
        want_assign[static_cast<size_t>(t * c.top_k + filled[static_cast<size_t>(t)]++)] = pos;
      }
    }
    EXPECT_EQ(Download(d_assign_of.data(), n_assign), want_assign) << where;
  }
}

// A step's routing arrays on the device (routing.h's sizes).
struct RoutingBuffers {
  RoutingBuffers(int64_t n_tokens, int64_t top_k, int64_t n_experts)
      : ids(Scratch<int32_t>(static_cast<size_t>(n_tokens * top_k))),
        weights(Scratch<float>(static_cast<size_t>(n_tokens * top_k))),
        n_active(Scratch<int32_t>(1)),
        experts(Scratch<int32_t>(static_cast<size_t>(n_experts))),
        begin(Scratch<int32_t>(static_cast<size_t>(n_experts + 1))),
        token_of(Scratch<int32_t>(static_cast<size_t>(n_tokens * top_k))),
        weight_of(Scratch<float>(static_cast<size_t>(n_tokens * top_k))),
        assign_of(Scratch<int32_t>(static_cast<size_t>(n_tokens * top_k))) {
    r.n_tokens = n_tokens;
    r.top_k = top_k;
    r.n_experts = n_experts;
    r.n_active = n_active.data();
    r.experts = experts.data();
    r.begin = begin.data();
    r.token_of = token_of.data();
    r.weight_of = weight_of.data();
    r.assign_of = assign_of.data();
  }
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights;
  DeviceBuffer<int32_t> n_active, experts, begin, token_of;
  DeviceBuffer<float> weight_of;
  DeviceBuffer<int32_t> assign_of;
  DeviceRouting r;
};

// LaunchRoute (one warp a token for at most 32 assignments, one block for a few tokens, else
// the two kernels) fills every array exactly as LaunchTopK then LaunchGroupByExpert do; those
// are checked against the CPU above. The cases: the warp path at 1-32 assignments (4 x 8 and
// 16 x 2 fill a warp; 300 experts take 16 a lane), then the block and the two kernels.
TEST(CudaRouteTest, GivesTheTopKAndGroupingResults) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const std::vector<TopKCase> cases = {{1, 128, 8},  {3, 8, 2},    {4, 128, 8},  {16, 8, 2},
                                       {2, 60, 6},   {1, 300, 16}, {11, 40, 3},  {16, 128, 8},
                                       {64, 128, 8}, {65, 128, 8}, {200, 64, 4}, {5, 512, 16},
                                       {40, 60, 6}};
  for (const TopKCase& c : cases) {
    for (bool normalize : {false, true}) {
      const std::vector<float> logits = MakeLogits(c.n_tokens, c.n_experts, c.top_k, true, rng);
      const DeviceBuffer<float> d_logits = Upload(logits);
      RoutingBuffers two(c.n_tokens, c.top_k, c.n_experts), one(c.n_tokens, c.top_k, c.n_experts);
      LaunchTopK(d_logits.data(), c.n_tokens, c.n_experts, c.top_k, normalize, two.ids.data(),
                 two.weights.data(), nullptr);
      LaunchGroupByExpert(two.ids.data(), two.weights.data(), two.r, nullptr);
      LaunchRoute(d_logits.data(), normalize, one.ids.data(), one.weights.data(), one.r, nullptr);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      const auto n_assign = static_cast<size_t>(c.n_tokens * c.top_k);
      const std::string where = "T " + std::to_string(c.n_tokens) + " E " +
                                std::to_string(c.n_experts) + " K " + std::to_string(c.top_k);
      const auto n_active = static_cast<size_t>(Download(two.n_active.data(), 1)[0]);
      ASSERT_EQ(Download(one.n_active.data(), 1)[0], static_cast<int32_t>(n_active)) << where;
      EXPECT_EQ(Download(one.ids.data(), n_assign), Download(two.ids.data(), n_assign)) << where;
      EXPECT_EQ(Download(one.weights.data(), n_assign), Download(two.weights.data(), n_assign))
          << where;
      EXPECT_EQ(Download(one.experts.data(), n_active), Download(two.experts.data(), n_active))
          << where;
      EXPECT_EQ(Download(one.begin.data(), n_active + 1), Download(two.begin.data(), n_active + 1))
          << where;
      EXPECT_EQ(Download(one.token_of.data(), n_assign), Download(two.token_of.data(), n_assign))
          << where;
      EXPECT_EQ(Download(one.weight_of.data(), n_assign), Download(two.weight_of.data(), n_assign))
          << where;
      EXPECT_EQ(Download(one.assign_of.data(), n_assign), Download(two.assign_of.data(), n_assign))
          << where;
    }
  }
}

}  // namespace
}  // namespace moetier::cuda
