// MeasurePerplexity against the perplexity computed here from the model's logits, window by
// window, as llama.cpp's llama-perplexity defines it (engine/perplexity.h).
#include "engine/perplexity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "support/seed.h"
#include "support/test_support.h"

namespace moetier {
namespace {

struct Reference {
  double perplexity = 0, plus_minus = 0;
  int64_t count = 0;
};

// Each window alone through CausalLM::Forward; -log softmax(row j - 1)[token j] for j from
// ctx / 2 + 1 to ctx - 1, in double precision.
Reference ReferencePerplexity(CausalLM& model, const std::vector<int32_t>& tokens, int64_t ctx,
                              std::optional<int32_t> bos, int64_t windows) {
  const int64_t V = model.config().vocab_size;
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> window(tokens.begin() + w * ctx, tokens.begin() + (w + 1) * ctx);
    if (bos) window.front() = *bos;
    KvCache cache = *model.NewCache(ctx);
    std::vector<float> logits;
    EXPECT_TRUE(model.Forward(window, cache, LogitsFor::kAllTokens, logits).ok());
    for (int64_t j = ctx / 2 + 1; j < ctx; ++j) {
      const float* row = logits.data() + (j - 1) * V;
      double max = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) max = std::max(max, static_cast<double>(row[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
      const double x = max + std::log(sum) - row[window[static_cast<size_t>(j)]];
      nll += x;
      nll2 += x * x;
      ++count;
    }
  }
  Reference r;
  r.count = count;
  const double mean = nll / static_cast<double>(count);
  r.perplexity = std::exp(mean);
  r.plus_minus = std::sqrt((nll2 / static_cast<double>(count) - mean * mean) /
                           static_cast<double>(count - 1)) *
                 r.perplexity;
  return r;
}

class PerplexityTest : public ::testing::TestWithParam<const char*> {};

// Random tokens, windows run three at once through the engine, with and without a BOS put first:
// the perplexity and its error equal the reference's; --chunks limits the windows.
TEST_P(PerplexityTest, EqualsTheLogitsWindowByWindow) {
  auto m = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(2));
  ASSERT_TRUE(m.ok()) << m.message();
  CausalLM& model = **m;
  const uint32_t seed = testing::TestSeed();
  std::mt19937 rng(seed);
  const int64_t ctx = 8 + static_cast<int64_t>(rng() % 24);
  std::vector<int32_t> tokens(static_cast<size_t>(ctx * 3 + rng() % ctx));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % model.config().vocab_size);
  for (std::optional<int32_t> bos : {std::optional<int32_t>(), std::optional<int32_t>(1)}) {
    for (int64_t max_windows : {int64_t{-1}, int64_t{2}}) {
      SCOPED_TRACE("ctx " + std::to_string(ctx) + (bos ? ", a BOS first" : "") + ", windows " +
                   std::to_string(max_windows));
      EngineOptions eo;
      eo.kv_positions = 4 * ctx;
      eo.max_running = 3;
      eo.max_batch_tokens = 2 * ctx;
      auto engine = Engine::Create(model, nullptr, eo);
      ASSERT_TRUE(engine.ok()) << engine.message();
      PerplexityOptions o;
      o.ctx = ctx;
      o.bos = bos;
      o.max_windows = max_windows;
      int64_t reported = 0;
      auto got =
          MeasurePerplexity(**engine, tokens, o, [&](int64_t done, int64_t total, double running) {
            EXPECT_EQ(done, ++reported);
            EXPECT_EQ(total, max_windows < 0 ? 3 : 2);
            EXPECT_GT(running, 0.0);
          });
      ASSERT_TRUE(got.ok()) << got.message();
      const int64_t windows = max_windows < 0 ? 3 : 2;
      const Reference want = ReferencePerplexity(model, tokens, ctx, bos, windows);
      EXPECT_EQ(got->windows, windows);
      EXPECT_EQ(reported, windows);
      EXPECT_EQ(got->tokens_scored, windows * (ctx - 1 - ctx / 2));
      EXPECT_EQ(got->tokens_scored, want.count);
      EXPECT_NEAR(got->perplexity, want.perplexity, 1e-4 * want.perplexity);
      EXPECT_NEAR(got->plus_minus, want.plus_minus, 1e-3 * want.plus_minus + 1e-9);
    }
  }
}

TEST_P(PerplexityTest, TooShortATextOrWindowIsAnError) {
  auto m = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(1));
  ASSERT_TRUE(m.ok()) << m.message();
  EngineOptions eo;
  eo.kv_positions = 64;
  auto engine = Engine::Create(**m, nullptr, eo);
  ASSERT_TRUE(engine.ok()) << engine.message();
  PerplexityOptions o;
  o.ctx = 16;
  const std::vector<int32_t> tokens(31, 1);
  auto r = MeasurePerplexity(**engine, tokens, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("at least 32"), std::string::npos) << r.message();
  o.ctx = 3;
  r = MeasurePerplexity(**engine, tokens, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("--ctx"), std::string::npos) << r.message();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PerplexityTest,
                         ::testing::Values("qwen3_moe", "realvocab/mixtral_tiny"),
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

}  // namespace
}  // namespace moetier
