// With the experts on the GPU, answers must not depend on where their bytes came from: all in
// VRAM (--moe-backend gpu), or pinned banks under offload — copied miss by miss into the smallest
// expert cache (evicted and copied again within the run), into a cache that holds them all, or
// streamed whole through the prefill buffers. The same kernels over the same routing: the same
// bits. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/model_source.h"
#include "support/gpu.h"
#include "support/test_support.h"

namespace moetier {
namespace {

struct Outcome {
  std::vector<float> logits;  // the prompt's every position, then each decoded token's
  LayerExpertStats totals;    // with offload
};

// A 24-token prompt in one step (above the fixtures' streaming threshold: 2 x experts / top-k,
// their banks being tiny), then 8 steps of one token each.
Outcome PromptThenDecode(const std::filesystem::path& dir, Backend backend, uint64_t cache_bytes) {
  LoadOptions o;
  o.residency.backend = backend;
  o.residency.cpu_layers = "0";
  o.residency.expert_cache_bytes = cache_bytes;
  auto m = LoadCausalLM(dir, o);
  EXPECT_TRUE(m.ok()) << m.message();
  Outcome r;
  if (!m.ok()) return r;
  CausalLM& lm = **m;
  EXPECT_EQ(lm.device(), ComputeDevice::kGpu);
  lm.CollectExpertStats();
  KvCache cache = *lm.NewCache(64);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 24; ++i) prompt.push_back((i * 37 + 11) % 200);
  std::vector<float> logits;
  EXPECT_TRUE(lm.Forward(prompt, cache, LogitsFor::kAllTokens, logits).ok());
  r.logits = logits;
  for (int32_t t = 0; t < 8; ++t) {
    const std::vector<int32_t> one = {(t * 53 + 7) % 200};
    EXPECT_TRUE(lm.Forward(one, cache, LogitsFor::kLastToken, logits).ok());
    r.logits.insert(r.logits.end(), logits.begin(), logits.end());
  }
  for (const LayerExpertStats& l : lm.expert_stats()->Snapshot()) r.totals += l;
  return r;
}

class GpuPlacement : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuPlacement, ExpertBytesFromVramCacheOrStreamGiveTheSameBits) {
  MT_REQUIRE_GPU();
  const auto dir = testing::HfFixture(GetParam());
  const uint64_t one_layer = testing::OneLayerOfExperts(dir);
  const Outcome vram = PromptThenDecode(dir, Backend::kGpu, 0);
  const Outcome smallest = PromptThenDecode(dir, Backend::kOffload, one_layer);
  const Outcome whole = PromptThenDecode(dir, Backend::kOffload, 64 * one_layer);
  ASSERT_FALSE(vram.logits.empty());
  EXPECT_EQ(smallest.logits, vram.logits);
  EXPECT_EQ(whole.logits, vram.logits);
  // The prompt streamed every layer's bank (one miss per expert); the decode steps went
  // through the cache: the smallest one misses again, the whole one keeps what it copied.
  auto s = OpenModelSource(dir);
  ASSERT_TRUE(s.ok());
  const int64_t bank_misses = s->config.n_moe_layers() * s->config.n_experts;
  EXPECT_GE(smallest.totals.cache_misses, bank_misses);
  EXPECT_GT(smallest.totals.cache_misses - bank_misses, 0) << "the decode steps never missed";
  EXPECT_GT(whole.totals.cache_hits, 0);
  EXPECT_GT(smallest.totals.h2d_ns, 0) << "the copies were not timed";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuPlacement, ::testing::Values("qwen3_moe", "mixtral"));

}  // namespace
}  // namespace moetier
