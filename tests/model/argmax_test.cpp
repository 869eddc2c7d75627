// ForwardArgMax hands back what kernels::ArgMax picks from each row of Forward's logits, and
// ForwardTopK what kernels::TopKCandidates keeps, step for step: on the CPU, and with a GPU under
// gpu and offload with decode steps recorded and replayed (a step that ends in the arg-max or the
// candidates is recorded apart from one that ends in the logits). A non-finite logit is the same
// error either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "kernels/cpu/elementwise.h"
#include "model/causal_lm.h"
#include "model/model_source.h"
#include "support/test_support.h"

#ifdef MOETIER_WITH_CUDA
#include "kernels/cuda/cuda_check.h"
#endif

namespace moetier {
namespace {

bool HaveGpu() {
#ifdef MOETIER_WITH_CUDA
  return cuda::DeviceAvailable();
#else
  return false;
#endif
}

struct Placement {
  std::string name;
  LoadOptions options;
};

// The CPU engine, and with a GPU the experts in VRAM and in pinned banks through the smallest
// cache.
std::vector<Placement> Placements(const std::filesystem::path& dir) {
  std::vector<Placement> runs;
  runs.push_back({"cpu", testing::WithThreads(2)});
  if (!HaveGpu()) return runs;
  LoadOptions gpu;
  gpu.residency.backend = Backend::kGpu;
  runs.push_back({"gpu", gpu});
  LoadOptions offload;
  offload.residency.backend = Backend::kOffload;
  offload.residency.cpu_layers = "0";
  offload.residency.expert_cache_bytes = testing::OneLayerOfExperts(dir);
  runs.push_back({"offload", offload});
  return runs;
}

class ArgMaxSteps : public ::testing::TestWithParam<std::string> {};

// The fixture under each placement: three sequences' prompts, then 10 steps in which each decodes
// one token (testing::ForEachThreeSequenceStep); `step` runs each batch (twice over, Forward
// then the call under test: the second rewrites the step's K/V rows with the same values).
using StepCheck =
    std::function<void(CausalLM& lm, KvPool& pool, const Batch& batch, const std::string& at)>;
void RunStepsUnderEachPlacement(const std::string& fixture, const StepCheck& step) {
  const auto dir = testing::HfFixture(fixture);
  if (!HaveGpu()) std::printf("note: no CUDA device; the GPU runs of this test are skipped\n");
  for (const Placement& run : Placements(dir)) {
    SCOPED_TRACE(run.name);
    auto m = LoadCausalLM(dir, run.options);
    ASSERT_TRUE(m.ok()) << m.message();
    CausalLM& lm = **m;
    EXPECT_EQ(lm.CandidatesOnDevice(), run.name != "cpu");
    auto pool = lm.NewKvPool(64, 16, DType::kF32);
    ASSERT_TRUE(pool.ok()) << pool.message();
    testing::ForEachThreeSequenceStep(16, 10, [&](const Batch& batch, bool, const std::string& at) {
      step(lm, *pool, batch, at);
    });
    // On a GPU each kind of decode step, per shape (the longest sequence crosses the context
    // bucket at position 256: 6 steps, then 4), runs once, is recorded once and is replayed
    // after that: 4 + 2 replayed of each kind.
    if (run.name != "cpu") {
      EXPECT_EQ(lm.ReplayedSteps(), 12);
    }
  }
}

// The ids are the logits' arg-max.
TEST_P(ArgMaxSteps, IdsAreTheLogitsArgMax) {
  std::vector<float> logits;
  std::vector<int32_t> ids;
  RunStepsUnderEachPlacement(
      GetParam(), [&](CausalLM& lm, KvPool& pool, const Batch& batch, const std::string& at) {
        const int64_t V = lm.config().vocab_size;
        ASSERT_TRUE(lm.Forward(batch, pool, logits).ok()) << at;
        ASSERT_TRUE(lm.ForwardArgMax(batch, pool, ids).ok()) << at;
        ASSERT_EQ(ids.size(), batch.logit_rows.size()) << at;
        for (size_t r = 0; r < ids.size(); ++r)
          EXPECT_EQ(ids[r], kernels::ArgMax(logits.data() + static_cast<int64_t>(r) * V, V))
              << at << ", row " << r;
      });
}

// Each row's candidates are kernels::TopKCandidates of its logits, LogitsRow reads the row back,
// and a sampler drawing from the candidates draws what it draws from the row.
TEST_P(ArgMaxSteps, TopKCandidatesAreTheLogitsTopK) {
  SamplerOptions sampling;
  sampling.temperature = 0.8f;
  sampling.top_k = 20;
  sampling.top_p = 0.9f;
  std::vector<float> logits, row;
  TopKRows top;
  std::vector<LogitCandidate> want(kMaxLogitCandidates);
  uint64_t draws = 0;
  RunStepsUnderEachPlacement(
      GetParam(), [&](CausalLM& lm, KvPool& pool, const Batch& batch, const std::string& at) {
        const int64_t V = lm.config().vocab_size;
        ASSERT_TRUE(lm.Forward(batch, pool, logits).ok()) << at;
        ASSERT_TRUE(lm.ForwardTopK(batch, pool, top).ok()) << at;
        ASSERT_EQ(top.counts.size(), batch.logit_rows.size()) << at;
        for (size_t r = 0; r < top.counts.size(); ++r) {
          const float* l = logits.data() + static_cast<int64_t>(r) * V;
          const int32_t n =
              kernels::TopKCandidates(l, V, kMaxCandidateTopK, kMaxLogitCandidates, want.data());
          ASSERT_EQ(top.counts[r], n) << at << ", row " << r;
          const auto got = top.Row(r);
          for (int32_t i = 0; i < n; ++i) {
            EXPECT_EQ(got[static_cast<size_t>(i)].id, want[static_cast<size_t>(i)].id) << at;
            EXPECT_EQ(got[static_cast<size_t>(i)].logit, want[static_cast<size_t>(i)].logit) << at;
          }
          ASSERT_TRUE(lm.LogitsRow(static_cast<int64_t>(r), row).ok()) << at;
          EXPECT_TRUE(std::equal(row.begin(), row.end(), l)) << at << ", row " << r;
          sampling.seed = ++draws;
          Sampler from_row(sampling), from_candidates(sampling);
          auto want_token = from_row.Sample({l, static_cast<size_t>(V)});
          ASSERT_TRUE(want_token.ok()) << want_token.message();
          EXPECT_EQ(from_candidates.SampleCandidates(got), *want_token) << at << ", row " << r;
        }
      });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ArgMaxSteps, ::testing::Values("qwen3_moe", "mixtral"));

}  // namespace
}  // namespace moetier
