// --weight-packing at load, end to end on the fixtures: `bf16c` holds every CPU bank (and, with
// the cpu backend, the dense matrices but the routers) as BF16C and computes the logits of the
// bf16 model (bit for bit where bf16 and bf16c run the same kernels); `auto` packs nothing on
// rows this short; and a bank with a row BF16C cannot hold stays bf16 with a warning naming it,
// rather than failing the load (dense matrices: dense_holding_test.cpp, on their own, since no
// fixture has a dense row long enough to pack). A checkpoint's experts are packed once, into
// their banks, not again as dense matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "core/dtype.h"
#include "experts/expert_layout.h"
#include "experts/residency_report.h"
#include "io/bank_index.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/cpu_isa.h"
#include "model/arch/arch.h"
#include "model/bank_loader.h"
#include "model/causal_lm.h"
#include "model/convert.h"
#include "model/model_source.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures[] = {"realvocab/qwen3_moe_tiny", "mixtral"};
const std::vector<int32_t> kTokens = {1, 5, 9, 2, 7, 3, 11, 4};

ConvertOptions Opts(DType experts, std::optional<DType> dense = std::nullopt) {
  ConvertOptions o;
  o.expert_dtype = experts;
  o.dense_dtype = dense;
  o.n_threads = 2;
  return o;
}

struct Loaded {
  std::unique_ptr<CausalLM> model;
  std::vector<float> logits;  // of kTokens, every position
};

Loaded Load(const fs::path& dir, WeightPacking packing, Backend backend = Backend::kCpu,
            const std::string& cpu_layers = "auto", bool verify = true) {
  LoadOptions o = testing::WithThreads(2);
  o.residency.backend = backend;
  o.residency.cpu_layers = cpu_layers;
  o.residency.packing = packing;
  o.residency.verify = verify;
  auto m = LoadCausalLM(dir, o);
  EXPECT_TRUE(m.ok()) << dir << " " << WeightPackingName(packing) << ": " << m.message();
  Loaded out;
  if (!m.ok()) return out;
  out.model = std::move(*m);
  KvCache cache = *out.model->NewCache(64);
  EXPECT_TRUE(out.model->Forward(kTokens, cache, LogitsFor::kAllTokens, out.logits).ok());
  return out;
}

// bf16 and bf16c run the very same arithmetic on these levels (matmul_avx2_impl.h); on the
// AVX-512 ones bf16 has its own kernels, which sum in another order.
bool SameKernels() {
  using kernels::CpuIsa;
  const CpuIsa isa = kernels::ActiveCpuIsa();
  return isa == CpuIsa::kScalar || isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvxVnni;
}

// Bit for bit where the kernels are the same, else within a share of the logits' range: 1e-4
// where both sum fp32 products in another order; 1e-2 on the AVX-512 BF16 level, whose bf16
// kernels round the activations to bf16 (relative error 2^-9 a value; measured 3.4e-3 of the
// range on mixtral) while bf16c's run on fp32 activations.
void ExpectSameLogits(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(want.size(), got.size());
  if (SameKernels()) {
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
    return;
  }
  const double share = kernels::ActiveCpuIsa() == kernels::CpuIsa::kAvx512Bf16 ? 1e-2 : 1e-4;
  const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(want[i], got[i], share * (*hi - *lo)) << i;
}

uint64_t BankBytes(const ModelConfig& c, DType t) {
  return ExpertLayout{c.hidden_size, c.expert_intermediate_size, t}.bank_bytes(c.n_experts);
}

uint64_t ExpertBytes(const ModelConfig& c, DType t) {
  return ExpertLayout{c.hidden_size, c.expert_intermediate_size, t}.expert_bytes();
}

// `fixture` converted to bf16 into `dir`; returns the logits of kTokens with the experts held as
// stored (the reference for the packed ones).
std::vector<float> ConvertBf16(const std::string& fixture, const fs::path& dir) {
  EXPECT_TRUE(ConvertCheckpoint(testing::HfFixture(fixture), dir, Opts(DType::kBF16)).ok());
  const Loaded none = Load(dir, WeightPacking::kNone);
  EXPECT_TRUE(none.model);
  return none.logits;
}

// The CPU model of s's dense weights and `experts`; the logits of kTokens into `logits`.
std::unique_ptr<CausalLM> CpuModel(ModelSource& s, std::unique_ptr<BankedExperts> experts,
                                   std::vector<float>& logits) {
  auto model =
      s.spec->create(s.config, s.TakeDense(), std::move(experts), ComputeOptions{.n_threads = 2});
  EXPECT_TRUE(model.ok()) << model.message();
  if (!model.ok()) return nullptr;
  KvCache cache = *(*model)->NewCache(64);
  EXPECT_TRUE((*model)->Forward(kTokens, cache, LogitsFor::kAllTokens, logits).ok());
  return std::move(*model);
}

int64_t RowDelta(int64_t k) {
  return static_cast<int64_t>(DTypeRowBytes(DType::kBF16C, k)) -
         static_cast<int64_t>(DTypeRowBytes(DType::kBF16, k));
}

// How many more bytes a decoded token streams when the dense matrices of checkpoint `hf` but the
// routers (and `skip`) are held as BF16C rather than bf16, where that shrinks them: a token reads
// one row of the embedding and every other dense matrix whole (the lm_head is the embedding when
// tied).
int64_t DenseBf16cDelta(const fs::path& hf, const ModelConfig& c, const std::string& skip = "") {
  auto s = OpenModelSource(hf);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return 0;
  std::set<std::string> routers;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (c.layer_is_moe[static_cast<size_t>(l)]) routers.insert(s->spec->router_tensor_name(l));
  int64_t delta = 0;
  for (const auto& [name, t] : testing::ReadSafetensors(hf / "model.safetensors")) {
    if (t.shape.size() != 2 || t.dtype != "BF16" || routers.count(name) > 0 || name == skip ||
        name.find(".experts.") != std::string::npos)
      continue;
    const int64_t rows = t.shape[0], k = t.shape[1];
    EXPECT_EQ(k % 32, 0) << name;
    if (RowDelta(k) >= 0) continue;  // bf16c packs a dense matrix only if its rows shrink
    if (name.find("embed_tokens") != std::string::npos) {
      delta += RowDelta(k) * (c.tie_word_embeddings ? 1 + c.vocab_size : 1);
    } else {
      delta += rows * RowDelta(k);
    }
  }
  return delta;
}

void ExpectSettled(const CausalLM& m, DType want) {
  const ResidencyReport& r = m.residency();
  ASSERT_TRUE(r.settled.has_value());
  ASSERT_EQ(static_cast<int64_t>(r.settled->size()), m.config().n_moe_layers());
  for (const LayerResidency& l : *r.settled) {
    EXPECT_EQ(l.dtype, want) << "layer " << l.layer;
    EXPECT_EQ(l.bytes, BankBytes(m.config(), want)) << "layer " << l.layer;
  }
}

TEST(WeightPackingLoad, Bf16cHoldsEveryBankPackedAndComputesBf16sLogits) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;
    const fs::path b = tmp.path() / "b", c = tmp.path() / "c";
    ASSERT_TRUE(ConvertCheckpoint(hf, b, Opts(DType::kBF16)).ok());
    ASSERT_TRUE(ConvertCheckpoint(hf, c, Opts(DType::kBF16C, DType::kBF16C)).ok());
    // The model converted to bf16c, held as stored: the bytes a packed token should stream.
    const Loaded converted = Load(c, WeightPacking::kNone);
    ASSERT_TRUE(converted.model);
    ASSERT_EQ(converted.model->expert_dtype(), DType::kBF16C);
    const uint64_t want_bytes = converted.model->DecodeBytesPerToken();

    for (const fs::path& dir : {hf, b}) {
      SCOPED_TRACE(dir);
      const Loaded none = Load(dir, WeightPacking::kNone);
      const Loaded packed = Load(dir, WeightPacking::kBf16c);
      ASSERT_TRUE(none.model && packed.model);
      const ModelConfig& config = packed.model->config();
      ASSERT_NE(BankBytes(config, DType::kBF16C), BankBytes(config, DType::kBF16));

      ExpectSettled(*none.model, DType::kBF16);
      EXPECT_EQ(none.model->expert_dtype(), DType::kBF16);
      EXPECT_EQ(none.model->residency().stored_dtype, DType::kBF16);

      ExpectSettled(*packed.model, DType::kBF16C);
      EXPECT_EQ(packed.model->expert_dtype(), DType::kBF16C);
      const ResidencyReport& r = packed.model->residency();
      EXPECT_EQ(r.stored_dtype, DType::kBF16);
      for (const LayerResidency& l : r.plan.layers) {
        EXPECT_EQ(l.dtype, DType::kBF16C) << "layer " << l.layer;
        EXPECT_EQ(l.bytes, BankBytes(config, DType::kBF16C)) << "layer " << l.layer;
      }
      for (const std::string& w : r.warnings)
        EXPECT_EQ(w.find("bf16c"), std::string::npos) << w;  // every row packed

      ExpectSameLogits(none.logits, packed.logits);
      // The cpu backend would also pack the dense matrices, as --dense-dtype bf16c does: none of
      // these fixtures' (rows of 32-64 weights, which BF16C makes larger). A token streams what
      // the bf16c conversion's does.
      EXPECT_EQ(DenseBf16cDelta(hf, config), 0);
      EXPECT_EQ(packed.model->DecodeBytesPerToken(), want_bytes);

      // Offload with every layer on the CPU: the experts packed, the dense matrices as stored
      // (the GPU reads those), so a token streams what the bf16c conversion's does.
      const Loaded offload = Load(dir, WeightPacking::kBf16c, Backend::kOffload, "1.0");
      ASSERT_TRUE(offload.model);
      ExpectSettled(*offload.model, DType::kBF16C);
      EXPECT_EQ(offload.model->DecodeBytesPerToken(), want_bytes);
      ExpectSameLogits(none.logits, offload.logits);
    }
  }
}

TEST(WeightPackingLoad, AutoPacksNothingOnRowsThisShort) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;
    const fs::path b = tmp.path() / "b";
    ASSERT_TRUE(ConvertCheckpoint(hf, b, Opts(DType::kBF16)).ok());
    for (const fs::path& dir : {hf, b}) {
      SCOPED_TRACE(dir);
      const Loaded none = Load(dir, WeightPacking::kNone);
      const Loaded aut = Load(dir, WeightPacking::kAuto);
      ASSERT_TRUE(none.model && aut.model);
      ExpectSettled(*aut.model, DType::kBF16);
      for (const LayerResidency& l : aut.model->residency().plan.layers)
        EXPECT_EQ(l.dtype, DType::kBF16) << "layer " << l.layer;
      EXPECT_EQ(aut.model->expert_dtype(), DType::kBF16);
      // Nor the dense matrices: the same bytes, the same logits bit for bit on any ISA.
      EXPECT_EQ(aut.model->DecodeBytesPerToken(), none.model->DecodeBytesPerToken());
      EXPECT_EQ(aut.logits, none.logits);
    }
  }
}

// Checks a load of `dir` whose first MoE layer has a row BF16C cannot hold (expert 0's gate row
// 0): that layer stays bf16 with a warning naming it, the others pack, the logits are bf16's.
// `hf`: the fixture it was made from (for the shapes of its dense matrices).
void ExpectBankFallback(const fs::path& dir, const fs::path& hf, bool verify) {
  const Loaded none = Load(dir, WeightPacking::kNone, Backend::kCpu, "auto", verify);
  const Loaded packed = Load(dir, WeightPacking::kBf16c, Backend::kCpu, "auto", verify);
  ASSERT_TRUE(none.model && packed.model);
  const ModelConfig& config = packed.model->config();
  const ResidencyReport& r = packed.model->residency();
  ASSERT_TRUE(r.settled.has_value());
  ASSERT_GE(r.settled->size(), 2u);
  const int64_t bad_layer = (*r.settled)[0].layer;
  for (const LayerResidency& l : *r.settled) {
    const DType want = l.layer == bad_layer ? DType::kBF16 : DType::kBF16C;
    EXPECT_EQ(l.dtype, want) << "layer " << l.layer;
    EXPECT_EQ(l.bytes, BankBytes(config, want)) << "layer " << l.layer;
  }
  EXPECT_EQ(r.plan.layers[0].dtype, DType::kBF16C);  // planned packed; settled as stored
  const std::string named = "layer " + std::to_string(bad_layer) + " expert 0 gate row 0 ";
  int n_named = 0;
  for (const std::string& w : r.warnings) {
    if (w.find(named) == std::string::npos) continue;
    ++n_named;
    EXPECT_NE(w.find("stays BF16"), std::string::npos) << w;
  }
  EXPECT_EQ(n_named, 1) << ::testing::PrintToString(r.warnings);
  ExpectSameLogits(none.logits, packed.logits);
  // A token streams bf16 experts in that layer and packed ones in the others.
  const int64_t experts_delta = (config.n_moe_layers() - 1) * config.n_experts_per_token *
                                (static_cast<int64_t>(ExpertBytes(config, DType::kBF16C)) -
                                 static_cast<int64_t>(ExpertBytes(config, DType::kBF16)));
  EXPECT_EQ(static_cast<int64_t>(packed.model->DecodeBytesPerToken()),
            static_cast<int64_t>(none.model->DecodeBytesPerToken()) + experts_delta +
                DenseBf16cDelta(hf, config));
}

TEST(WeightPackingLoad, ABankWithARowThatCannotPackStaysAsStoredWithAWarning) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;

    // A converted model: the bank of the first MoE layer, corrupted in its data file.
    const fs::path b = tmp.path() / "b";
    ASSERT_TRUE(ConvertCheckpoint(hf, b, Opts(DType::kBF16)).ok());
    auto idx = ParseBankIndex(testing::ReadFile(b / kBankIndexFileName), "index");
    ASSERT_TRUE(idx.ok()) << idx.message();
    ASSERT_FALSE(idx->banks.empty());
    const BankIndexBank& bank = idx->banks[0];
    ASSERT_EQ(bank.dtype, DType::kBF16);
    const fs::path file = b / idx->files[bank.file].name;
    std::string data = testing::ReadFile(file);
    ASSERT_GE(data.size(), bank.offset + static_cast<uint64_t>(2 * bank.d_model));
    testing::WriteUnpackableRow(data.data() + bank.offset, bank.d_model);  // expert 0, gate, row 0
    testing::WriteFile(file, data);
    {
      SCOPED_TRACE("converted");
      ExpectBankFallback(b, hf, /*verify=*/false);
    }

    // A Hugging Face checkpoint: the same row of its safetensors.
    const fs::path h = tmp.path() / "hf";
    testing::CopyDir(hf, h);
    auto s = OpenModelSource(h);
    ASSERT_TRUE(s.ok()) << s.message();
    auto tensors = testing::ReadSafetensors(h / "model.safetensors");
    const std::string name = s->spec->expert_tensor_name(bank.layer, 0, ExpertMatrix::kGate);
    ASSERT_EQ(tensors.count(name), 1u) << name;
    testing::TensorSpec& t = tensors.at(name);
    ASSERT_EQ(t.shape.back(), bank.d_model);
    testing::WriteUnpackableRow(t.bytes.data(), bank.d_model);
    testing::WriteSafetensors(h / "model.safetensors", tensors);
    {
      SCOPED_TRACE("checkpoint");
      ExpectBankFallback(h, hf, /*verify=*/true);
    }
  }
}

// A Hugging Face checkpoint's store holds the experts' tensors beside the dense ones; the
// experts are packed once, into their banks, never again as dense matrices (a second packed
// copy of every expert that nothing reads). Seen through the one warning a row that cannot pack
// must give.
TEST(WeightPackingLoad, ACheckpointsExpertsAreNotPackedAgainAsDenseMatrices) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    testing::TempDir tmp;
    const fs::path h = tmp.path() / "hf";
    testing::CopyDir(testing::HfFixture(fixture), h);
    auto s = OpenModelSource(h);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_FALSE(s->banks.empty());
    const int64_t layer = s->banks[0].layer;
    auto tensors = testing::ReadSafetensors(h / "model.safetensors");
    const std::string name = s->spec->expert_tensor_name(layer, 0, ExpertMatrix::kGate);
    ASSERT_EQ(tensors.count(name), 1u) << name;
    testing::TensorSpec& t = tensors.at(name);
    testing::WriteUnpackableRow(t.bytes.data(), t.shape.back());
    testing::WriteSafetensors(h / "model.safetensors", tensors);

    const Loaded packed = Load(h, WeightPacking::kBf16c);
    ASSERT_TRUE(packed.model);
    const std::vector<std::string>& warnings = packed.model->residency().warnings;
    int n_unpackable = 0;
    for (const std::string& w : warnings) {
      EXPECT_EQ(w.find(name), std::string::npos) << "packed as a dense matrix: " << w;
      if (w.find("pack as bf16c") != std::string::npos) ++n_unpackable;
    }
    EXPECT_EQ(n_unpackable, 1) << ::testing::PrintToString(warnings);
  }
}

// LoadBanks with a plan that gives every layer a CPU copy (hybrid's, residency_plan.h; here on
// layers settled without a GPU): the bank stays as stored, the copy holds its values as BF16C,
// the CPU executor computes from the copy (the logits of the bf16 model), the report counts the
// copies, and ReleaseHost frees both.
TEST(WeightPackingLoad, ACpuCopyHoldsTheBankPackedAndTheCpuComputesFromIt) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    testing::TempDir tmp;
    const fs::path b = tmp.path() / "b";
    const std::vector<float> as_stored = ConvertBf16(fixture, b);
    auto s = OpenModelSource(b);
    ASSERT_TRUE(s.ok()) << s.message();
    const ModelConfig config = s->config;
    const uint64_t packed_bytes = BankBytes(config, DType::kBF16C);
    ResidencyPlan plan;
    plan.backend = Backend::kHybrid;
    for (const LayerBank& bank : s->banks) {
      LayerResidency l{bank.layer, Tier::kPinned, bank.bytes, DType::kBF16};
      l.cpu_copy_bytes = packed_bytes;
      l.cpu_copy_dtype = DType::kBF16C;
      plan.layers.push_back(l);
    }
    ThreadPool io_pool(2), pack_pool(2);
    BankLoadOptions no_gpu;  // the banks settle locked (pinned needs a GPU)
    auto banks = LoadBanks(*s, plan, no_gpu, io_pool, pack_pool);
    ASSERT_TRUE(banks.ok()) << banks.message();
    for (const LayerResidency& l : banks->settled) {
      EXPECT_EQ(l.dtype, DType::kBF16) << "layer " << l.layer;
      EXPECT_EQ(l.bytes, BankBytes(config, DType::kBF16)) << "layer " << l.layer;
      EXPECT_EQ(l.cpu_copy_bytes, packed_bytes) << "layer " << l.layer;
      EXPECT_EQ(l.cpu_copy_dtype, DType::kBF16C);
      EXPECT_TRUE(l.cpu_copy_tier == Tier::kLocked || l.cpu_copy_tier == Tier::kPageable);
    }
    for (const std::string& w : banks->warnings)  // every row packs; a lock may fail here
      EXPECT_EQ(w.find("pack as bf16c"), std::string::npos) << w;

    // Every row of the copy unpacks to the bank's bits.
    const BankedExperts& experts = *banks->experts;
    for (const LayerBank& bank : s->banks)
      for (int64_t e = 0; e < config.n_experts; ++e) {
        const ExpertWeights& stored = experts.Expert(bank.layer, e);
        const ExpertWeights& cpu = experts.CpuExpert(bank.layer, e);
        for (auto [from, packed] :
             {std::pair{&stored.gate, &cpu.gate}, std::pair{&stored.up, &cpu.up},
              std::pair{&stored.down, &cpu.down}}) {
          ASSERT_EQ(from->dtype, DType::kBF16);
          ASSERT_EQ(packed->dtype, DType::kBF16C);
          ASSERT_EQ(packed->shape, from->shape);
          const int64_t k = from->shape[1];
          std::vector<uint16_t> row(static_cast<size_t>(k));
          for (int64_t r = 0; r < from->shape[0]; ++r) {
            kernels::UnpackRowBf16c(
                static_cast<const uint8_t*>(packed->data) + r * DTypeRowBytes(DType::kBF16C, k), k,
                row.data());
            ASSERT_EQ(0, std::memcmp(row.data(), static_cast<const uint16_t*>(from->data) + r * k,
                                     row.size() * sizeof(uint16_t)))
                << "layer " << bank.layer << " expert " << e << " row " << r;
          }
        }
      }

    ResidencyReport report;
    report.plan = plan;
    report.settled = banks->settled;
    const auto j = ResidencyReportJson(report);
    EXPECT_EQ(j["bytes"]["cpu_copies"].get<uint64_t>(), packed_bytes * s->banks.size());
    EXPECT_EQ(j["settled"][0]["cpu_copy"]["dtype"], "BF16C");
    const std::vector<std::string> lines = TierSummaryLines(*report.settled);
    ASSERT_FALSE(lines.empty());
    EXPECT_NE(lines.back().find("pinned layers' CPU copies: " + std::to_string(s->banks.size()) +
                                " layers"),
              std::string::npos)
        << lines.back();

    // The CPU computes the bf16 model's logits from the copies.
    BankedExperts* raw = banks->experts.get();
    std::vector<float> logits;
    const std::unique_ptr<CausalLM> model = CpuModel(*s, std::move(banks->experts), logits);
    ASSERT_TRUE(model);
    ExpectSameLogits(as_stored, logits);

    const int64_t first = s->banks[0].layer;
    const std::vector<int64_t> released = {first};
    EXPECT_EQ(raw->ReleaseHost(released), BankBytes(config, DType::kBF16) + packed_bytes);
    EXPECT_EQ(raw->CpuExpert(first, 0).gate.data, nullptr);
    EXPECT_EQ(raw->CpuExpert(first, 0).gate.dtype, DType::kBF16C);
  }
}

// LoadBanks with a plan that holds the pinned banks packed (PlanInputs::pack_pinned; here settled
// without a GPU): the bank itself is BF16C, with no copy beside it, the CPU reads that bank, and
// computes the bf16 model's logits from it.
TEST(WeightPackingLoad, APackedPinnedBankIsTheCpusTooWithoutACopy) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    testing::TempDir tmp;
    const fs::path b = tmp.path() / "b";
    const std::vector<float> as_stored = ConvertBf16(fixture, b);
    auto s = OpenModelSource(b);
    ASSERT_TRUE(s.ok()) << s.message();
    const ModelConfig config = s->config;
    const uint64_t packed_bytes = BankBytes(config, DType::kBF16C);
    ResidencyPlan plan;
    plan.backend = Backend::kOffload;
    for (const LayerBank& bank : s->banks)
      plan.layers.push_back(LayerResidency{bank.layer, Tier::kPinned, packed_bytes, DType::kBF16C});
    ThreadPool io_pool(2), pack_pool(2);
    auto banks = LoadBanks(*s, plan, BankLoadOptions{}, io_pool, pack_pool);
    ASSERT_TRUE(banks.ok()) << banks.message();
    for (const LayerResidency& l : banks->settled) {
      EXPECT_EQ(l.dtype, DType::kBF16C) << "layer " << l.layer;
      EXPECT_EQ(l.bytes, packed_bytes) << "layer " << l.layer;
      EXPECT_FALSE(l.has_cpu_copy()) << "layer " << l.layer;
    }
    const BankedExperts& experts = *banks->experts;
    for (const LayerBank& bank : s->banks) {
      EXPECT_EQ(experts.Expert(bank.layer, 0).gate.dtype, DType::kBF16C);
      EXPECT_EQ(experts.CpuExpert(bank.layer, 0).gate.data,
                experts.Expert(bank.layer, 0).gate.data);
    }
    std::vector<float> logits;
    ASSERT_TRUE(CpuModel(*s, std::move(banks->experts), logits));
    ExpectSameLogits(as_stored, logits);
  }
}

}  // namespace
}  // namespace moetier
