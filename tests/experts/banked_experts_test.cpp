// BankedExperts::ReleaseHost: once a device holds a layer's experts, its host bank is freed and
// its views lose their data but keep what they describe (the decode step's byte counts read
// them); the other layers' stay as they were.
#include "experts/banked_experts.h"

#include <gtest/gtest.h>

#include <vector>

namespace moetier {
namespace {

TEST(BankedExperts, ReleaseHostFreesOnlyTheNamedLayers) {
  const ExpertLayout layout{64, 32, DType::kBF16};
  constexpr int64_t kExperts = 4;
  std::vector<HostBank> banks;
  for (int i = 0; i < 2; ++i) {
    auto b = HostBank::Allocate(layout.bank_bytes(kExperts));
    ASSERT_TRUE(b.ok()) << b.message();
    banks.push_back(std::move(*b));
  }
  const uint8_t* kept = banks[1].data();
  BankedExperts experts(3, {0, 2}, std::move(banks), {layout, layout}, kExperts);
  const uint64_t bank_bytes = experts.bank(0).size();
  ASSERT_GT(bank_bytes, 0u);
  ASSERT_NE(experts.Expert(0, 3).gate.data, nullptr);
  const ExpertWeights before = experts.Expert(0, 3);

  const std::vector<int64_t> layer0 = {0};
  EXPECT_EQ(experts.ReleaseHost(layer0), bank_bytes);
  EXPECT_EQ(experts.bank(0).size(), 0u);
  for (int64_t e = 0; e < kExperts; ++e) {
    const ExpertWeights& w = experts.Expert(0, e);
    EXPECT_EQ(w.gate.data, nullptr);
    EXPECT_EQ(w.up.data, nullptr);
    EXPECT_EQ(w.down.data, nullptr);
    EXPECT_EQ(w.gate.n_bytes, before.gate.n_bytes);
    EXPECT_EQ(w.down.n_bytes, before.down.n_bytes);
    EXPECT_EQ(w.down.shape, before.down.shape);
    EXPECT_EQ(w.up.dtype, DType::kBF16);
  }
  EXPECT_EQ(experts.Expert(2, 0).gate.data, kept);
  EXPECT_EQ(experts.ReleaseHost(layer0), 0u) << "a second release frees nothing";
}

}  // namespace
}  // namespace moetier
