// The KV cache in bf16 or f16 against f32 (exact): the same prompt's logits differ only by the
// rounding of the stored keys and values. Bound: each stored element is off by at most 2^-9
// (bf16) or 2^-11 (f16) of itself; through softmax-weighted sums and the layers that follow this
// shows in the logits as a small multiple of it, relative to the logits' scale. We hold every
// logit to kTolerances' rel x (1 + max |logit|) and check that greedy choices agree wherever
// f32's top two logits are further apart than that, up to the first position where the
// perturbation flips a router's choice of experts (a near-tie between two experts: from there
// on the two runs compute different functions, and no rounding bound applies). That can be the
// first position (its attention reads its own value row as stored, and a router's top two can
// sit 3e-5 apart there); a prompt where both dtypes flip it compares nothing, so the test draws
// another prompt, up to kPrompts, and checks that one of them compared some positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "model/causal_lm.h"
#include "support/seed.h"
#include "support/test_support.h"

namespace moetier {
namespace {

struct Tolerance {
  DType dtype;
  float rel;  // of (1 + max |logit|)
};
// 8x the element's rounding (bf16 2^-9, f16 2^-11): room for its growth over the layers (the
// fixtures measure 1-6e-3 for bf16 and 4-7e-4 for f16).
constexpr Tolerance kTolerances[] = {{DType::kBF16, 8.0f / 512}, {DType::kF16, 8.0f / 2048}};

constexpr int kPrompts = 4;

class KvDType : public ::testing::TestWithParam<const char*> {
 protected:
  // Compares one prompt's logits under every kTolerances dtype with f32's; adds to `compared`
  // the positions compared (those before each dtype's first change of routing).
  void ComparePrompt(CausalLM& lm, const std::vector<int32_t>& tokens, size_t& compared);
};

TEST_P(KvDType, LogitsStayWithinTheStoredRounding) {
  std::mt19937 rng(testing::TestSeed());
  auto model = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(2));
  ASSERT_TRUE(model.ok()) << model.message();
  const auto V = static_cast<uint32_t>((*model)->config().vocab_size);
  size_t compared = 0;  // positions compared over both dtypes and every prompt drawn
  for (int prompt = 0; prompt < kPrompts && compared == 0 && !HasFatalFailure(); ++prompt) {
    std::vector<int32_t> tokens(40);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
    ComparePrompt(**model, tokens, compared);
  }
  EXPECT_GT(compared, 0u) << "every dtype flipped the first position's routing in each of "
                          << kPrompts << " prompts: nothing compared";
}

void KvDType::ComparePrompt(CausalLM& lm, const std::vector<int32_t>& tokens, size_t& compared) {
  const int64_t V = lm.config().vocab_size;
  const int64_t E = lm.config().n_experts, K = lm.config().n_experts_per_token;
  // Logits of every position, and per position the experts each MoE layer chose (sorted ids).
  struct Run {
    std::vector<float> logits;
    std::vector<std::vector<int32_t>> experts;  // [position][layer * K + j]
  };
  auto run_with = [&](DType dtype) {
    KvCache cache = *lm.NewCache(64, dtype);
    Run r;
    std::vector<float> step;
    std::vector<std::vector<float>> router;
    lm.SetRouterLogitsSink(&router);
    auto chosen = [&](int64_t n_tokens) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::vector<int32_t> ids;
        for (const auto& layer : router) {
          if (layer.empty()) continue;
          std::vector<int32_t> order(static_cast<size_t>(E));
          std::iota(order.begin(), order.end(), 0);
          const float* l = layer.data() + t * E;
          std::partial_sort(order.begin(), order.begin() + K, order.end(),
                            [&](int32_t a, int32_t b) { return l[a] > l[b]; });
          std::sort(order.begin(), order.begin() + K);
          ids.insert(ids.end(), order.begin(), order.begin() + K);
        }
        r.experts.push_back(ids);
      }
    };
    // A prompt, then decode steps reading what the prompt stored.
    EXPECT_TRUE(
        lm.Forward(std::span(tokens).first(30), cache, LogitsFor::kAllTokens, r.logits).ok());
    chosen(30);
    for (size_t t = 30; t < tokens.size(); ++t) {
      EXPECT_TRUE(
          lm.Forward(std::span(tokens).subspan(t, 1), cache, LogitsFor::kLastToken, step).ok());
      r.logits.insert(r.logits.end(), step.begin(), step.end());
      chosen(1);
    }
    lm.SetRouterLogitsSink(nullptr);
    return r;
  };
  const Run f32 = run_with(DType::kF32);
  const std::vector<float>& exact = f32.logits;
  for (const Tolerance& tol : kTolerances) {
    const Run run = run_with(tol.dtype);
    const std::vector<float>& got = run.logits;
    ASSERT_EQ(got.size(), exact.size());
    size_t same_routing = 0;
    while (same_routing < tokens.size() && run.experts[same_routing] == f32.experts[same_routing])
      ++same_routing;
    double worst = 0;
    for (size_t row = 0; row < same_routing; ++row) {
      const auto first = exact.begin() + static_cast<ptrdiff_t>(row * V);
      float scale = 0;
      for (int64_t i = 0; i < V; ++i) scale = std::max(scale, std::fabs(first[i]));
      const float bound = tol.rel * (1.0f + scale);
      int64_t best = 0, second = -1;
      for (int64_t i = 0; i < V; ++i) {
        const float e = first[i], g = got[row * V + static_cast<size_t>(i)];
        worst = std::max(worst, static_cast<double>(std::fabs(e - g) / (1.0f + scale)));
        ASSERT_LE(std::fabs(e - g), bound)
            << DTypeName(tol.dtype) << " row " << row << " logit " << i;
        if (e > first[best]) best = i;
      }
      for (int64_t i = 0; i < V; ++i)
        if (i != best && (second < 0 || first[i] > first[second])) second = i;
      if (first[best] - first[second] > 2 * bound) {
        const auto g0 = got.begin() + static_cast<ptrdiff_t>(row * V);
        EXPECT_EQ(std::max_element(g0, g0 + V) - g0, best)
            << DTypeName(tol.dtype) << " row " << row;
      }
    }
    std::printf(
        "%s: KV %s: worst |logit error| / (1 + max |logit|) = %.2e (bound %.2e) over the first "
        "%zu of %zu positions (the routing first differs after them)\n",
        GetParam(), std::string(DTypeName(tol.dtype)).c_str(), worst, tol.rel, same_routing,
        tokens.size());
    compared += same_routing;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvDType,
                         ::testing::Values("qwen3_moe", "mixtral", "realvocab/qwen3_moe_tiny",
                                           "realvocab/mixtral_tiny"),
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

}  // namespace
}  // namespace moetier
