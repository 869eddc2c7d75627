// With the experts on the GPU, answers must not depend on where their bytes came from: all in
// VRAM (--moe-backend gpu), or pinned banks under offload — copied miss by miss into the smallest
// expert cache (evicted and copied again within the run), into a cache that holds them all, or
// streamed whole through the prefill buffers. The same kernels over the same routing: the same
// bits. Hybrid computes some misses on the CPU instead: the same bits when it fetches them all,
// within the GPU tolerance of offload otherwise. And greedy continuations do not depend on the
// split between CPU layers and GPU layers, the pin budget or the hybrid split. Decode steps
// replayed from CUDA graphs give the bits of launching each kernel. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "experts/expert_layout.h"
#include "io/safetensors.h"
#include "model/causal_lm.h"
#include "model/convert.h"
#include "model/model_source.h"
#include "support/gpu.h"
#include "support/seed.h"
#include "support/test_support.h"

namespace moetier {
namespace {

struct Outcome {
  std::vector<float> logits;         // the prompt's every position, then each decoded token's
  LayerExpertStats totals;           // with offload
  uint64_t cpu_copy_bytes = 0;       // hybrid's CPU copies of pinned layers, as settled
  DType pinned_dtype = DType::kF32;  // the first pinned bank's, as settled
  DType locked_dtype = DType::kF32;  // the first locked (or pageable) bank's
  DType gpu_dtype = DType::kF32;     // the first bank's in VRAM (gpu), as reported
  uint64_t gpu_bytes = 0;            // every bank's in VRAM, as reported
};

// A 24-token prompt in one step (above the fixtures' streaming threshold: 2 x experts / top-k,
// their banks being tiny), then 8 steps of one token each.
Outcome PromptThenDecode(const std::filesystem::path& dir, Backend backend, uint64_t cache_bytes,
                         double fetch_share = -1, const std::string& cpu_layers = "0",
                         int stage_locked = -1, WeightPacking packing = WeightPacking::kAuto,
                         int pack_pinned = 0, int64_t staging_experts = 0) {
  LoadOptions o;
  o.residency.staging_experts = staging_experts;
  o.residency.backend = backend;
  o.residency.pack_pinned = pack_pinned;
  o.residency.packing = packing;
  o.residency.cpu_layers = cpu_layers;
  o.stage_locked = stage_locked;
  o.residency.expert_cache_bytes = cache_bytes;
  o.residency.fetch_share = fetch_share;
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
  for (const LayerResidency& l : *lm.residency().settled) {
    r.cpu_copy_bytes += l.cpu_copy_bytes;
    if (l.tier == Tier::kPinned && r.pinned_dtype == DType::kF32) r.pinned_dtype = l.dtype;
    if (IsCpuTier(l.tier) && r.locked_dtype == DType::kF32) r.locked_dtype = l.dtype;
    if (l.tier == Tier::kGpu && r.gpu_dtype == DType::kF32) r.gpu_dtype = l.dtype;
    if (l.tier == Tier::kGpu) r.gpu_bytes += l.bytes;
  }
  return r;
}

// Within the GPU placements' tolerance of `want` (fp32 both, summed in another order).
void ExpectNearLogits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 4e-5f * (1.0f + std::fabs(want[i]))) << "logit " << i;
}

// Whether the fixture's expert rows fit bf16c (whole 32-blocks); if not, says so and what the
// test leaves out.
bool ExpertsFitBf16c(const ModelSource& s, const std::string& fixture, const char* left_out) {
  if (ExpertLayout{s.layout.d_model, s.layout.width, DType::kBF16C}.valid()) return true;
  std::printf("[ NOTE ] %s: expert rows do not fit bf16c; %s\n", fixture.c_str(), left_out);
  return false;
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

// A locked layer's long prefill step staged to the GPU through the pinned ring runs the pinned
// layers' streaming kernels on the same bytes: the prompt's logits are the bits of that layer
// pinned. Computed by the CPU executor instead, they are not (and the staged run did not take
// that way).
TEST_P(GpuPlacement, StagedLockedLayerGivesThePinnedBits) {
  MT_REQUIRE_GPU();
  const auto dir = testing::HfFixture(GetParam());
  const uint64_t one_layer = testing::OneLayerOfExperts(dir);
  const Outcome pinned = PromptThenDecode(dir, Backend::kOffload, one_layer);
  const Outcome staged = PromptThenDecode(dir, Backend::kOffload, one_layer, -1, "1", 1);
  const Outcome on_cpu = PromptThenDecode(dir, Backend::kOffload, one_layer, -1, "1", 0);
  auto s = OpenModelSource(dir);
  ASSERT_TRUE(s.ok());
  const auto prompt = static_cast<std::ptrdiff_t>(24 * s->config.vocab_size);
  ASSERT_GE(static_cast<std::ptrdiff_t>(pinned.logits.size()), prompt);
  ASSERT_EQ(staged.logits.size(), pinned.logits.size());
  ASSERT_EQ(on_cpu.logits.size(), pinned.logits.size());
  EXPECT_TRUE(
      std::equal(staged.logits.begin(), staged.logits.begin() + prompt, pinned.logits.begin()));
  EXPECT_FALSE(
      std::equal(on_cpu.logits.begin(), on_cpu.logits.begin() + prompt, pinned.logits.begin()));
  // The prompt step copied every layer's bank, the staged one's too.
  const int64_t bank_misses = s->config.n_moe_layers() * s->config.n_experts;
  EXPECT_GE(staged.totals.fetched_experts, bank_misses);
  // The locked layer held as BF16C (as bf16 models' locked layers are by default, where their
  // rows shrink): staged packed, expanded on the GPU, the same bits.
  if (!ExpertsFitBf16c(*s, GetParam(), "no packed locked layer to stage")) return;
  const Outcome packed =
      PromptThenDecode(dir, Backend::kOffload, one_layer, -1, "1", 1, WeightPacking::kBf16c);
  EXPECT_EQ(packed.locked_dtype, DType::kBF16C);
  EXPECT_EQ(packed.pinned_dtype, DType::kBF16);
  ASSERT_EQ(packed.logits.size(), pinned.logits.size());
  EXPECT_TRUE(
      std::equal(packed.logits.begin(), packed.logits.begin() + prompt, pinned.logits.begin()));
  EXPECT_GE(packed.totals.fetched_experts, bank_misses);
}

// Hybrid fetching every miss runs offload's kernels on offload's routing (the split's path,
// with nothing for the CPU): the same bits. Fetching some or none, the CPU executor's products
// replace the GPU's for the rest: within the GPU placements' tolerance of offload (fp32 both,
// summed in another order), and the decode steps did split.
TEST_P(GpuPlacement, HybridMatchesOffload) {
  MT_REQUIRE_GPU();
  const auto dir = testing::HfFixture(GetParam());
  const uint64_t one_layer = testing::OneLayerOfExperts(dir);
  const Outcome offload = PromptThenDecode(dir, Backend::kOffload, one_layer);
  ASSERT_FALSE(offload.logits.empty());
  const Outcome all_fetched = PromptThenDecode(dir, Backend::kHybrid, one_layer, 1.0);
  EXPECT_EQ(all_fetched.logits, offload.logits);
  EXPECT_EQ(all_fetched.totals.cpu_experts, 0);
  for (double share : {0.0, 0.5, -1.0}) {
    SCOPED_TRACE("fetch share " + std::to_string(share));
    const Outcome hybrid = PromptThenDecode(dir, Backend::kHybrid, one_layer, share);
    ASSERT_NO_FATAL_FAILURE(ExpectNearLogits(hybrid.logits, offload.logits));
    EXPECT_GT(hybrid.totals.split_calls, 0);
    EXPECT_EQ(hybrid.totals.fetched_experts + hybrid.totals.cpu_experts,
              hybrid.totals.cache_misses);
    if (share == 0.0) {
      EXPECT_GT(hybrid.totals.cpu_experts, 0);
    }
    EXPECT_EQ(hybrid.cpu_copy_bytes, 0u) << "rows this short stay as stored under auto";
  }
  // With a bf16c copy of every pinned layer, the CPU computes its share from the copy: the same
  // values, so within the same tolerance. (Where the experts' rows fit bf16c: whole 32-blocks.)
  auto s = OpenModelSource(dir);
  ASSERT_TRUE(s.ok()) << s.message();
  if (!ExpertsFitBf16c(*s, GetParam(), "no CPU copy to compare")) return;
  const Outcome copied =
      PromptThenDecode(dir, Backend::kHybrid, one_layer, 0.0, "0", -1, WeightPacking::kBf16c);
  EXPECT_GT(copied.cpu_copy_bytes, 0u);
  EXPECT_GT(copied.totals.cpu_experts, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectNearLogits(copied.logits, offload.logits));
}

// Pinned banks held as BF16C (pack_pinned) cross PCIe packed and are expanded into the cache's
// slots and the prefill stream buffers: the bf16 a stored bank puts there, so offload gives the
// same bits, having copied the packed bytes. Hybrid's CPU share reads the packed bank itself (no
// CPU copy): within the tolerance above.
TEST_P(GpuPlacement, PackedPinnedBanksGiveTheStoredBits) {
  MT_REQUIRE_GPU();
  const auto dir = testing::HfFixture(GetParam());
  auto s = OpenModelSource(dir);
  ASSERT_TRUE(s.ok()) << s.message();
  if (!ExpertsFitBf16c(*s, GetParam(), "nothing to pack")) return;
  const ExpertLayout packed_layout{s->layout.d_model, s->layout.width, DType::kBF16C};
  const uint64_t one_layer = testing::OneLayerOfExperts(dir);
  const Outcome stored = PromptThenDecode(dir, Backend::kOffload, one_layer);
  // (bf16c packing: these short rows do not shrink, so auto would not pack them.)
  const Outcome packed = PromptThenDecode(dir, Backend::kOffload, one_layer, -1, "0", -1,
                                          WeightPacking::kBf16c, /*pack_pinned=*/1);
  ASSERT_FALSE(stored.logits.empty());
  EXPECT_EQ(stored.pinned_dtype, DType::kBF16);
  EXPECT_EQ(packed.pinned_dtype, DType::kBF16C);
  EXPECT_EQ(packed.logits, stored.logits);
  // The same routing through the same cache: the same experts fetched, each its packed bytes.
  EXPECT_EQ(packed.totals.fetched_experts, stored.totals.fetched_experts);
  EXPECT_EQ(packed.totals.bytes_h2d,
            packed.totals.fetched_experts * static_cast<int64_t>(packed_layout.expert_bytes()));
  EXPECT_GT(packed.totals.h2d_ns, 0);
  // Staged a wave of 3 at a time (as where VRAM is short), the prompt through the cache too.
  const Outcome waves = PromptThenDecode(dir, Backend::kOffload, one_layer, -1, "0", -1,
                                         WeightPacking::kBf16c, /*pack_pinned=*/1, 3);
  EXPECT_EQ(waves.logits, stored.logits);
  EXPECT_EQ(waves.totals.bytes_h2d,
            waves.totals.fetched_experts * static_cast<int64_t>(packed_layout.expert_bytes()));

  const Outcome hybrid = PromptThenDecode(dir, Backend::kHybrid, one_layer, 0.5, "0", -1,
                                          WeightPacking::kBf16c, /*pack_pinned=*/1);
  EXPECT_EQ(hybrid.pinned_dtype, DType::kBF16C);
  EXPECT_EQ(hybrid.cpu_copy_bytes, 0u);
  EXPECT_GT(hybrid.totals.cpu_experts, 0);
  EXPECT_GT(hybrid.totals.fetched_experts, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectNearLogits(hybrid.logits, stored.logits));
}

// A qwen3_moe-shaped model with rows long enough for bf16c to pack its dense matrices too (the
// fixtures' 64-element rows stay as stored: DenseTarget): hidden 256, head_dim 64, 8 experts of
// width 64, 2 layers; random bf16 weights.
std::filesystem::path WriteWideQwen3Moe(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json config =
      nlohmann::json::parse(testing::ReadFile(testing::HfFixture("qwen3_moe") / "config.json"));
  const int64_t H = 256, D = 64, W = 64, E = 8, V = config["vocab_size"];
  const int64_t Q = config["num_attention_heads"].get<int64_t>() * D;
  const int64_t KV = config["num_key_value_heads"].get<int64_t>() * D;
  config["hidden_size"] = H;
  config["head_dim"] = D;
  config["moe_intermediate_size"] = W;
  config["num_experts"] = E;
  config["num_hidden_layers"] = 2;
  testing::WriteFile(dir / "config.json", config.dump(2));
  std::mt19937 rng(testing::TestSeed());
  std::map<std::string, testing::TensorSpec> t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float sigma) {
    std::normal_distribution<float> dist(mean, sigma);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string bytes(static_cast<size_t>(n) * 2, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = F32ToBf16(dist(rng));
      std::memcpy(bytes.data() + i * 2, &b, 2);
    }
    t[name] = {"BF16", std::move(shape), std::move(bytes)};
  };
  add("model.embed_tokens.weight", {V, H}, 0, 1);
  add("lm_head.weight", {V, H}, 0, 0.06f);
  add("model.norm.weight", {H}, 1, 0.1f);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, 1, 0.1f);
    add(p + "post_attention_layernorm.weight", {H}, 1, 0.1f);
    add(p + "self_attn.q_proj.weight", {Q, H}, 0, 0.06f);
    add(p + "self_attn.k_proj.weight", {KV, H}, 0, 0.06f);
    add(p + "self_attn.v_proj.weight", {KV, H}, 0, 0.06f);
    add(p + "self_attn.o_proj.weight", {H, Q}, 0, 0.06f);
    add(p + "self_attn.q_norm.weight", {D}, 1, 0.1f);
    add(p + "self_attn.k_norm.weight", {D}, 1, 0.1f);
    add(p + "mlp.gate.weight", {E, H}, 0, 0.06f);
    for (int e = 0; e < E; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(x + "gate_proj.weight", {W, H}, 0, 0.06f);
      add(x + "up_proj.weight", {W, H}, 0, 0.06f);
      add(x + "down_proj.weight", {H, W}, 0, 0.12f);
    }
  }
  testing::WriteSafetensors(dir / "model.safetensors", t);
  return dir;
}

// A model converted to bf16c (experts and dense matrices) runs on the GPU expanded to bf16: in
// VRAM at load (gpu), or after each copy (offload's pinned banks, held as stored): the bits of
// the bf16 model it was converted from, and the report says what VRAM holds.
TEST(GpuBf16c, AConvertedModelGivesTheBf16Bits) {
  MT_REQUIRE_GPU();
  testing::TempDir tmp;
  const std::filesystem::path dir = WriteWideQwen3Moe(tmp.path() / "bf16");
  const std::filesystem::path packed = tmp.path() / "bf16c";
  ConvertOptions o;
  o.expert_dtype = DType::kBF16C;
  o.dense_dtype = DType::kBF16C;
  o.n_threads = 2;
  auto converted = ConvertCheckpoint(dir, packed, o);
  ASSERT_TRUE(converted.ok()) << converted.message();
  EXPECT_EQ(converted->n_dense_converted, 2 + 2 * 4);  // embedding, lm_head, q/k/v/o a layer
  const uint64_t one_layer = testing::OneLayerOfExperts(dir);
  for (Backend backend : {Backend::kGpu, Backend::kOffload}) {
    SCOPED_TRACE(std::string(BackendName(backend)));
    const uint64_t cache = backend == Backend::kGpu ? 0 : one_layer;
    const Outcome want = PromptThenDecode(dir, backend, cache);
    const Outcome got = PromptThenDecode(packed, backend, cache);
    ASSERT_FALSE(want.logits.empty());
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_EQ(got.gpu_dtype, want.gpu_dtype);
    EXPECT_EQ(got.gpu_bytes, want.gpu_bytes);
    if (backend == Backend::kGpu) {
      EXPECT_EQ(got.gpu_dtype, DType::kBF16);
    }
  }
}

struct Decoded {
  std::vector<float> logits;  // each decode step's, in sequence order
  int64_t replayed = 0;       // steps replayed from a CUDA graph
};

// Where the experts are: every one in VRAM, or offloaded (the smallest cache), hybrid (half the
// misses fetched), or offloaded with one layer on the CPU executor.
struct Placement {
  Backend backend = Backend::kGpu;
  std::string cpu_layers = "0";
  double fetch_share = -1;
};

// testing::ForEachThreeSequenceStep with 12 decode steps, their logits kept.
Decoded DecodeTogether(const std::filesystem::path& dir, const Placement& p, bool cuda_graphs) {
  LoadOptions o;
  o.residency.backend = p.backend;
  o.residency.cpu_layers = p.cpu_layers;
  o.residency.fetch_share = p.fetch_share;
  if (p.backend != Backend::kGpu) o.residency.expert_cache_bytes = testing::OneLayerOfExperts(dir);
  o.cuda_graphs = cuda_graphs;
  auto m = LoadCausalLM(dir, o);
  EXPECT_TRUE(m.ok()) << m.message();
  Decoded r;
  if (!m.ok()) return r;
  CausalLM& lm = **m;
  auto pool = lm.NewKvPool(64, 16, DType::kF32);
  EXPECT_TRUE(pool.ok()) << pool.message();
  if (!pool.ok()) return r;
  std::vector<float> logits;
  testing::ForEachThreeSequenceStep(
      16, 12, [&](const Batch& batch, bool decoding, const std::string&) {
        EXPECT_TRUE(lm.Forward(batch, *pool, logits).ok());
        if (decoding) r.logits.insert(r.logits.end(), logits.begin(), logits.end());
      });
  r.replayed = lm.ReplayedSteps();
  return r;
}

// Decode steps replayed from recorded CUDA graphs compute what launching each kernel computes:
// the same bits, with the experts in VRAM (the whole step one graph) or offloaded (a graph per
// segment between the host's waits). Per shape, the first step runs eagerly, the second is
// recorded, the rest are replayed: 4 of the 6 steps of each of the two shapes.
TEST_P(GpuPlacement, RecordedDecodeStepsGiveTheSameBits) {
  MT_REQUIRE_GPU();
  const auto dir = testing::HfFixture(GetParam());
  const std::vector<std::pair<std::string, Placement>> placements = {
      {"gpu", {Backend::kGpu, "0", -1}},
      {"offload", {Backend::kOffload, "0", -1}},
      {"hybrid", {Backend::kHybrid, "0", 0.5}},
      {"offload, a layer on the CPU", {Backend::kOffload, "1", -1}}};
  for (const auto& [name, placement] : placements) {
    SCOPED_TRACE(name);
    const Decoded launched = DecodeTogether(dir, placement, false);
    const Decoded recorded = DecodeTogether(dir, placement, true);
    ASSERT_FALSE(launched.logits.empty());
    EXPECT_EQ(recorded.logits, launched.logits);
    EXPECT_EQ(launched.replayed, 0);
    EXPECT_EQ(recorded.replayed, 8);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuPlacement, ::testing::Values("qwen3_moe", "mixtral"));

// Greedy continuations of the fixtures' prompts equal Hugging Face's (until the reference's
// margin falls under the GPU tolerance) whatever the layers' split: every MoE layer through the
// cache, one or all of them on the CPU executor, a pin budget of one layer's bank (the plan locks
// the rest), and hybrid with its measured split.
struct Split {
  Backend backend;
  std::string cpu_layers;
  bool one_layer_pin_budget;
  const char* name;
};

TEST_P(GpuPlacement, GreedyContinuationsDoNotDependOnTheSplit) {
  MT_REQUIRE_GPU();
  const auto dir = testing::HfFixture(GetParam());
  auto ref = SafetensorsFile::Open(dir / "reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.message();
  auto source = OpenModelSource(dir);
  ASSERT_TRUE(source.ok());
  const std::string all = std::to_string(source->config.n_moe_layers());
  const Split splits[] = {{Backend::kOffload, "0", false, "offload, no CPU layer"},
                          {Backend::kOffload, "1", false, "offload, one CPU layer"},
                          {Backend::kOffload, all, false, "offload, every layer on the CPU"},
                          {Backend::kOffload, "auto", true, "offload, pin budget one layer"},
                          {Backend::kHybrid, "0", false, "hybrid, measured split"}};
  for (const Split& split : splits) {
    SCOPED_TRACE(split.name);
    LoadOptions o;
    o.residency.backend = split.backend;
    o.residency.cpu_layers = split.cpu_layers;
    o.residency.expert_cache_bytes = testing::OneLayerOfExperts(dir);
    if (split.one_layer_pin_budget)
      o.residency.budgets.pin_budget_gb =
          static_cast<double>(testing::OneLayerOfExperts(dir)) / 1e9;
    auto m = LoadCausalLM(dir, o);
    ASSERT_TRUE(m.ok()) << m.message();
    testing::ExpectGreedyLikeReference(**m, *ref);
  }
}

}  // namespace
}  // namespace moetier
