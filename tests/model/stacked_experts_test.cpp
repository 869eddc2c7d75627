// A checkpoint that stacks each MoE layer's experts into one tensor per matrix,
// [n_experts, rows, cols] (GGUF's blk.N.ffn_gate_exps.weight), read through an ArchSpec whose
// expert_tensor names those slices: its expert views are the per-expert checkpoint's bytes, and
// the model it loads gives the per-expert model's logits bit for bit. The stacked checkpoints are
// the Qwen3-MoE fixtures restacked in a temporary directory, opened under a test-only spec.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "experts/expert_layout.h"
#include "experts/residency_plan.h"
#include "model/arch/arch.h"
#include "model/bank_loader.h"
#include "model/causal_lm.h"
#include "model/model_source.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;
using testing::TensorSpec;

constexpr ExpertMatrix kMatrices[] = {ExpertMatrix::kGate, ExpertMatrix::kUp, ExpertMatrix::kDown};

// GGUF's names for a layer's stacked expert matrices.
ExpertTensorBinding StackedExpertTensor(int64_t layer, int64_t expert, ExpertMatrix which) {
  const char* matrix = which == ExpertMatrix::kGate ? "ffn_gate_exps"
                       : which == ExpertMatrix::kUp ? "ffn_up_exps"
                                                    : "ffn_down_exps";
  return {"blk." + std::to_string(layer) + "." + matrix + ".weight", expert};
}

// Qwen3-MoE in every respect but where its experts are.
const arch::ArchSpec& StackedQwen3MoeSpec() {
  static const arch::ArchSpec spec = [] {
    arch::ArchSpec s = arch::Qwen3MoeSpec();
    s.expert_tensor = &StackedExpertTensor;
    return s;
  }();
  return spec;
}

// Copies the fixture `src` into `dst` with each MoE layer's per-expert tensors replaced by one
// stacked tensor per matrix, the experts in order; `n_stacked` experts of each (all: -1).
void WriteStackedCopy(const fs::path& src, const fs::path& dst, int64_t n_stacked = -1) {
  testing::CopyDir(src, dst);
  auto s = OpenModelSource(src);
  ASSERT_TRUE(s.ok()) << s.message();
  const int64_t n = n_stacked < 0 ? s->config.n_experts : n_stacked;
  auto tensors = testing::ReadSafetensors(src / "model.safetensors");
  for (const LayerBank& b : s->banks) {
    for (ExpertMatrix m : kMatrices) {
      TensorSpec stacked;
      for (int64_t e = 0; e < s->config.n_experts; ++e) {
        const auto it = tensors.find(s->spec->expert_tensor_name(b.layer, e, m));
        ASSERT_NE(it, tensors.end());
        if (e == 0) {
          stacked.dtype = it->second.dtype;
          stacked.shape = {n};
          stacked.shape.insert(stacked.shape.end(), it->second.shape.begin(),
                               it->second.shape.end());
        }
        if (e < n) stacked.bytes += it->second.bytes;
        tensors.erase(it);
      }
      tensors[StackedExpertTensor(b.layer, 0, m).name] = std::move(stacked);
    }
  }
  testing::WriteSafetensors(dst / "model.safetensors", tensors);
}

bool SameBytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.n_bytes == b.n_bytes &&
         std::memcmp(a.data, b.data, a.n_bytes) == 0;
}

class StackedExperts : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    original_ = testing::HfFixture(GetParam());
    stacked_ = tmp_.path() / "stacked";
    WriteStackedCopy(original_, stacked_);
  }
  testing::TempDir tmp_;
  fs::path original_, stacked_;
};

TEST_P(StackedExperts, ViewsAreThePerExpertBytesSlicedFromTheStackedTensor) {
  auto per_expert = OpenModelSource(original_);
  auto stacked = OpenModelSourceAs(stacked_, StackedQwen3MoeSpec());
  ASSERT_TRUE(per_expert.ok()) << per_expert.message();
  ASSERT_TRUE(stacked.ok()) << stacked.message();
  EXPECT_EQ(stacked->layout.dtype, per_expert->layout.dtype);
  ASSERT_EQ(stacked->banks.size(), per_expert->banks.size());
  for (const LayerBank& b : stacked->banks) {
    SCOPED_TRACE("layer " + std::to_string(b.layer));
    auto want = CheckpointExperts(*per_expert, b.layer);
    auto got = CheckpointExperts(*stacked, b.layer);
    ASSERT_TRUE(want.ok()) << want.message();
    ASSERT_TRUE(got.ok()) << got.message();
    ASSERT_EQ(got->size(), want->size());
    const TensorView* gate = stacked->hf->Find(StackedExpertTensor(b.layer, 0, kMatrices[0]).name);
    ASSERT_NE(gate, nullptr);
    for (size_t e = 0; e < got->size(); ++e) {
      EXPECT_TRUE(SameBytes((*got)[e].gate, (*want)[e].gate)) << "expert " << e;
      EXPECT_TRUE(SameBytes((*got)[e].up, (*want)[e].up)) << "expert " << e;
      EXPECT_TRUE(SameBytes((*got)[e].down, (*want)[e].down)) << "expert " << e;
      // A view into the stacked tensor's map, not a copy.
      EXPECT_EQ((*got)[e].gate.bytes(), gate->bytes() + e * (*got)[e].gate.n_bytes);
    }
  }
}

TEST_P(StackedExperts, ExpertTensorNamesNameEachStackedTensorOnce) {
  auto s = OpenModelSourceAs(stacked_, StackedQwen3MoeSpec());
  ASSERT_TRUE(s.ok()) << s.message();
  std::set<std::string> want;
  for (const LayerBank& b : s->banks)
    for (ExpertMatrix m : kMatrices) want.insert(StackedExpertTensor(b.layer, 0, m).name);
  EXPECT_EQ(ExpertTensorNames(*s), want);
}

// The cache CausalLM::NewCache made, whichever of KvCache or Expected<KvCache> it returns;
// nullptr when it failed.
template <typename Made>
KvCache* CacheOf(Made& made) {
  if constexpr (std::is_same_v<Made, KvCache>) {
    return &made;
  } else {
    EXPECT_TRUE(made.ok()) << made.message();
    return made.ok() ? &made.value() : nullptr;
  }
}

// The model `spec` makes of the checkpoint in `dir`, its banks loaded by LoadBanks as `held`
// (as stored, or packed from the checkpoint's maps), and its logits for a few tokens.
// `held` must suit the experts' rows (BF16C: whole 32-blocks).
std::vector<float> Logits(const fs::path& dir, const arch::ArchSpec& spec, DType held) {
  auto s = OpenModelSourceAs(dir, spec);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return {};
  ResidencyPlan plan;
  for (const LayerBank& b : s->banks) {
    const ExpertLayout lay{s->layout.d_model, s->layout.width, held};
    plan.layers.push_back({b.layer, Tier::kPageable, lay.bank_bytes(s->config.n_experts), held});
  }
  ThreadPool io_pool(2), pack_pool(2);
  auto banks = LoadBanks(*s, plan, BankLoadOptions{}, io_pool, pack_pool);
  EXPECT_TRUE(banks.ok()) << banks.message();
  if (!banks.ok()) return {};
  for (const LayerResidency& r : banks->settled) EXPECT_EQ(r.dtype, held) << "layer " << r.layer;
  const ModelConfig config = s->config;
  auto model = spec.create(config, s->TakeDense(), std::move(banks->experts),
                           ComputeOptions{.n_threads = 2});
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return {};
  auto made = (*model)->NewCache(64);
  KvCache* cache = CacheOf(made);
  if (cache == nullptr) return {};
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3, 11, 4};
  std::vector<float> logits;
  EXPECT_TRUE((*model)->Forward(tokens, *cache, LogitsFor::kAllTokens, logits).ok());
  return logits;
}

TEST_P(StackedExperts, TheModelGivesThePerExpertLogitsBitForBit) {
  auto s = OpenModelSource(original_);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<DType> held_dtypes = {s->layout.dtype};
  if (ExpertLayout{s->layout.d_model, s->layout.width, DType::kBF16C}.valid())
    held_dtypes.push_back(DType::kBF16C);
  for (DType held : held_dtypes) {
    SCOPED_TRACE(std::string(DTypeName(held)));
    const std::vector<float> want = Logits(original_, arch::Qwen3MoeSpec(), held);
    const std::vector<float> got = Logits(stacked_, StackedQwen3MoeSpec(), held);
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
  }
}

TEST_P(StackedExperts, AStackedTensorOfTheWrongShapeIsAnErrorNamingIt) {
  const fs::path short_stack = tmp_.path() / "short";
  auto full = OpenModelSource(original_);
  ASSERT_TRUE(full.ok()) << full.message();
  const int64_t E = full->config.n_experts;
  WriteStackedCopy(original_, short_stack, /*n_stacked=*/E - 1);
  auto s = OpenModelSourceAs(short_stack, StackedQwen3MoeSpec());
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = CheckpointExperts(*s, s->banks[0].layer);
  ASSERT_FALSE(r.ok());
  const std::string name = StackedExpertTensor(s->banks[0].layer, 0, ExpertMatrix::kGate).name;
  const auto shape = [&](int64_t n) {
    return ShapeToString({n, s->layout.width, s->layout.d_model});
  };
  EXPECT_NE(r.message().find("'" + name + "' has shape " + shape(E - 1)), std::string::npos)
      << r.message();
  EXPECT_NE(r.message().find("implies " + shape(E)), std::string::npos) << r.message();
}

TEST_P(StackedExperts, OpeningAsAnotherArchitectureIsAnError) {
  auto s = OpenModelSourceAs(stacked_, arch::MixtralSpec());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Qwen3MoeForCausalLM"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("MixtralForCausalLM"), std::string::npos) << s.message();
}

// qwen3_moe: the classic spellings, bf16 experts of width 48 (held as stored); qwen3_moe_tiny:
// rows BF16C can hold, so its banks are also packed from the stacked views.
INSTANTIATE_TEST_SUITE_P(Fixtures, StackedExperts,
                         ::testing::Values("qwen3_moe", "realvocab/qwen3_moe_tiny"));

}  // namespace
}  // namespace moetier
