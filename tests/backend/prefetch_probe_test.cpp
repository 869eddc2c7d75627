// PrefetchProbe: the hit counting on hand-made logits; the probe's predictions on a hand-made
// sequence of backend calls (routers that read one coordinate each, so every ranking is known);
// and a fixture model behind the probe: the same logits bit for bit, and counts for every MoE
// layer that follows another.
#include "backend/prefetch_probe.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ops/expert_source.h"
#include "support/seed.h"
#include "support/test_support.h"

namespace moetier {
namespace {

TEST(PrefetchHits, CountsChosenExpertsInEachPredictedSet) {
  RouterOptions opts;
  opts.n_experts = 4;
  opts.top_k = 2;
  const float predicted[] = {
      0.1f, 2.0f, 1.0f, 0.5f,  // ranked 1, 2, 3, 0
      1.0f, 1.0f, 1.0f, 1.0f,  // all tied: ranked by id, 0, 1, 2, 3
  };
  const int32_t chosen[] = {1, 3, 3, 2};
  const int64_t sizes[] = {2, 3, 4};
  std::vector<int64_t> hits(3, 0);
  AddPrefetchHits(predicted, chosen, 2, opts, sizes, hits);
  // Size 2: {1, 2} holds 1 of {1, 3}; {0, 1} none of {3, 2}. Size 3: {1, 2, 3} both; {0, 1, 2}
  // one. Size 4: every expert.
  EXPECT_EQ(hits, (std::vector<int64_t>{1, 3, 4}));
  AddPrefetchHits(predicted, chosen, 2, opts, sizes, hits);  // adds to what is there
  EXPECT_EQ(hits, (std::vector<int64_t>{2, 6, 8}));
}

TEST(PrefetchHits, ChosenExpertsAreTheRoutersTopKWithTiesToTheLowerId) {
  RouterOptions opts;
  opts.n_experts = 4;
  opts.top_k = 2;
  const float logits[] = {0.0f, 3.0f, 3.0f, 1.0f, -1.0f, -2.0f, 5.0f, -1.0f};
  int32_t ids[4];
  ChosenExperts(logits, 2, opts, ids);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{1, 2, 2, 0}));
}

TEST(PrefetchCounts, RecallIsHitsOverTokensTimesTopK) {
  PrefetchCounts c;
  c.top_k = 2;
  c.n_experts = 8;
  c.set_sizes = {2, 4};
  c.layers.resize(2);
  c.layers[0].by_predictor[0] = {10, {15, 19}};
  c.layers[1].by_predictor[0] = {10, {5, 20}};
  EXPECT_DOUBLE_EQ(c.Recall(c.layers[0].by_predictor[0], 0), 0.75);
  EXPECT_DOUBLE_EQ(c.Recall(PrefetchPredictor::kMoeInput, 0), 0.5);
  EXPECT_DOUBLE_EQ(c.Recall(PrefetchPredictor::kMoeInput, 1), 39.0 / 40.0);
  EXPECT_EQ(c.Tokens(PrefetchPredictor::kMoeInput), 20);
  EXPECT_TRUE(std::isnan(c.Recall(PrefetchPredictor::kResidual, 0)));  // nothing counted
}

constexpr int64_t kD = 64, kE = 4, kWidth = 32;

// Experts whose weights are all zero: the MoE output is zero, so the residual is unchanged.
class ZeroExperts : public ExpertSource {
 public:
  ZeroExperts() : gate_up_(static_cast<size_t>(kWidth * kD), 0.0f), down_(gate_up_.size(), 0.0f) {
    const size_t n = gate_up_.size() * sizeof(float);
    w_.gate = TensorView{DType::kF32, {kWidth, kD}, gate_up_.data(), n};
    w_.up = w_.gate;
    w_.down = TensorView{DType::kF32, {kD, kWidth}, down_.data(), n};
  }
  const ExpertWeights& Expert(int64_t, int64_t) const override { return w_; }

 private:
  std::vector<float> gate_up_, down_;
  ExpertWeights w_;
};

// [n_tokens, kD] rows whose first four values are given, the rest zero.
std::vector<float> Rows(std::initializer_list<std::array<float, 4>> heads) {
  std::vector<float> rows;
  for (const auto& h : heads) {
    rows.insert(rows.end(), h.begin(), h.end());
    rows.resize(rows.size() + static_cast<size_t>(kD - 4), 0.0f);
  }
  return rows;
}

// The decoder's calls for two MoE layers, 0 and 1, over two tokens, on the probe: routers that
// read coordinate e of their input as expert e's logit make every ranking known. The residual
// h starts as h0 (layer 0's attention adds nothing); layer 1's attention adds `attn`; layer 1's
// post-attention norm doubles coordinate 1.
TEST(PrefetchProbe, PredictsFromTheLastMoeInputAndFromTheResidual) {
  ZeroExperts experts;
  PrefetchProbe probe(std::make_unique<CpuBackend>(1, experts, kD));
  std::vector<float> router(static_cast<size_t>(kE * kD), 0.0f);
  for (int64_t e = 0; e < kE; ++e) router[static_cast<size_t>(e * kD + e)] = 1.0f;
  const TensorView router_view{DType::kF32, {kE, kD}, router.data(), router.size() * 4};
  RouterOptions opts;
  opts.n_experts = kE;
  opts.top_k = 1;
  const float eps = 1e-6f;
  const std::vector<float> ones(kD, 1.0f);
  std::vector<float> doubles_1 = ones;
  doubles_1[1] = 2.0f;

  const int64_t T = 2;
  std::vector<float> h = Rows({{4, 3, 0, 0}, {0, 0, 1, 2}});
  const std::vector<float> zero(h.size(), 0.0f);
  const std::vector<float> attn = Rows({{0, 0, 0, 5}, {0, 0, 0, 0}});
  std::vector<float> xn(h.size()), delta(h.size());
  // Layer 0: x_0 = RmsNorm(h0), ranked as h0: token 0 {0, 1}, token 1 {3, 2}.
  probe.AddRmsNorm(zero.data(), T, h.data(), ones, eps, kD, xn.data());
  probe.Moe(router_view, opts, 0, xn.data(), T, delta.data(), nullptr);
  probe.AddRmsNorm(delta.data(), T, h.data(), ones, eps, kD, xn.data());  // h_0 = h0
  // Layer 1: its input h0 + attn with coordinate 1 doubled: token 0 (4, 6, 0, 5) chooses 1,
  // token 1 (0, 0, 1, 2) chooses 3. The residual predictor ranks h0 with coordinate 1 doubled:
  // token 0 {1, 0}, token 1 {3, 2}.
  probe.AddRmsNorm(attn.data(), T, h.data(), doubles_1, eps, kD, xn.data());
  probe.Moe(router_view, opts, 1, xn.data(), T, delta.data(), nullptr);

  const PrefetchCounts c = probe.TakeCounts();
  EXPECT_EQ(c.top_k, 1);
  EXPECT_EQ(c.set_sizes, (std::vector<int64_t>{1, 2}));
  ASSERT_EQ(c.layers.size(), 1u);
  EXPECT_EQ(c.layers[0].layer, 1);
  const auto& from_x = c.layers[0].by_predictor[0];
  const auto& from_h = c.layers[0].by_predictor[1];
  EXPECT_EQ(from_x.tokens, T);
  EXPECT_EQ(from_x.hits, (std::vector<int64_t>{1, 2}));  // token 0: 1 not in {0}, in {0, 1}
  EXPECT_EQ(from_h.tokens, T);
  EXPECT_EQ(from_h.hits, (std::vector<int64_t>{2, 2}));

  // Counting starts afresh; a layer that does not follow the last one predicts nothing.
  EXPECT_TRUE(probe.TakeCounts().layers.empty());
  probe.Moe(router_view, opts, 3, xn.data(), T, delta.data(), nullptr);
  EXPECT_TRUE(probe.TakeCounts().layers.empty());
}

// Every fixture has at least two MoE layers, all its layers MoE.
class PrefetchProbeModel : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefetchProbeModel, SameLogitsAndCountsForEveryFollowingMoeLayer) {
  const uint32_t seed = testing::TestSeed();
  std::mt19937 rng(seed);
  PrefetchProbe* probe = nullptr;
  LoadOptions wrapped = testing::WithThreads(2);
  wrapped.wrap_backend = [&probe](std::unique_ptr<ComputeBackend> inner) {
    auto p = std::make_unique<PrefetchProbe>(std::move(inner));
    probe = p.get();
    return std::unique_ptr<ComputeBackend>(std::move(p));
  };
  auto with = LoadCausalLM(testing::HfFixture(GetParam()), wrapped);
  ASSERT_TRUE(with.ok()) << with.message();
  ASSERT_NE(probe, nullptr);
  auto without = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(2));
  ASSERT_TRUE(without.ok()) << without.message();
  const ModelConfig& config = (*with)->config();

  std::vector<int32_t> prompt(13);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % config.vocab_size);
  KvCache cache_with = *(*with)->NewCache(32), cache_without = *(*without)->NewCache(32);
  std::vector<float> a, b;
  ASSERT_TRUE((*with)->Forward(prompt, cache_with, LogitsFor::kAllTokens, a).ok());
  ASSERT_TRUE((*without)->Forward(prompt, cache_without, LogitsFor::kAllTokens, b).ok());
  EXPECT_EQ(a, b);
  const PrefetchCounts prefill = probe->TakeCounts();
  for (int step = 0; step < 3; ++step) {
    const int32_t next[1] = {static_cast<int32_t>(rng() % config.vocab_size)};
    ASSERT_TRUE((*with)->Forward(next, cache_with, LogitsFor::kLastToken, a).ok());
    ASSERT_TRUE((*without)->Forward(next, cache_without, LogitsFor::kLastToken, b).ok());
    EXPECT_EQ(a, b);
  }
  const PrefetchCounts decode = probe->TakeCounts();

  EXPECT_EQ(prefill.top_k, config.n_experts_per_token);
  EXPECT_EQ(prefill.n_experts, config.n_experts);
  for (const auto& [c, tokens] : {std::pair{&prefill, int64_t{13}}, {&decode, int64_t{3}}}) {
    ASSERT_EQ(static_cast<int64_t>(c->layers.size()), config.n_layers - 1);
    for (size_t i = 0; i < c->layers.size(); ++i) {
      EXPECT_EQ(c->layers[i].layer, static_cast<int64_t>(i) + 1);
      for (const PrefetchCounts::Cell& cell : c->layers[i].by_predictor) {
        EXPECT_EQ(cell.tokens, tokens);
        EXPECT_LE(cell.hits[0], cell.hits[1]);
        EXPECT_LE(cell.hits[1], tokens * c->top_k);
        if (c->set_sizes[1] == c->n_experts) {
          EXPECT_EQ(cell.hits[1], tokens * c->top_k);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefetchProbeModel,
                         ::testing::Values("qwen3_moe", "mixtral", "realvocab/qwen3_moe_tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '/') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace moetier
