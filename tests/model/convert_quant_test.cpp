// moetier convert --dtype q8_0|q4_0 and --dense-dtype: the banks hold exactly what an independent
// quantization of the Hugging Face tensors gives, laid out as ExpertLayout says; routers and norms
// stay as they were; the quantized models load, size their banks right and compute logits close
// to the bf16 model's; rows that are not whole 32-blocks are a clear error before anything is
// written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "core/dtype.h"
#include "experts/expert_layout.h"
#include "io/bank_index.h"
#include "kernels/cpu/quant.h"
#include "model/arch/arch.h"
#include "model/causal_lm.h"
#include "model/convert.h"
#include "model/model_source.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;
using testing::TensorSpec;

// The fixtures whose row lengths are whole 32-blocks: realvocab/qwen3_moe_tiny (hidden 32, expert
// width 32, tied embeddings) and mixtral (hidden 64, expert width 96: gate/up and down rows then
// differ in bytes once quantized).
const std::string kFixtures[] = {"realvocab/qwen3_moe_tiny", "mixtral"};

std::vector<float> ToFloats(const TensorSpec& t) {
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t.dtype == "F32") {
      std::memcpy(&out[i], t.bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      out[i] = t.dtype == "BF16" ? Bf16ToF32(h) : F16ToF32(h);
    }
  }
  return out;
}

// The bytes convert must write for `t` as `dt`: each row quantized on its own.
std::string Quantize(const TensorSpec& t, DType dt) {
  const int64_t k = t.shape.back();
  const int64_t rows = static_cast<int64_t>(ToFloats(t).size()) / k;
  const std::vector<float> x = ToFloats(t);
  std::string out(static_cast<size_t>(rows) * DTypeRowBytes(dt, k), '\0');
  for (int64_t r = 0; r < rows; ++r) {
    void* dst = out.data() + static_cast<size_t>(r) * DTypeRowBytes(dt, k);
    if (dt == DType::kQ8_0)
      kernels::QuantizeRowQ8_0(x.data() + r * k, k, dst);
    else
      kernels::QuantizeRowQ4_0(x.data() + r * k, k, dst);
  }
  return out;
}

BankIndex ReadIndex(const fs::path& dir) {
  auto idx = ParseBankIndex(testing::ReadFile(dir / kBankIndexFileName), "index");
  EXPECT_TRUE(idx.ok()) << idx.message();
  return idx.ok() ? *idx : BankIndex{};
}

const BankIndexTensor* FindTensor(const BankIndex& idx, const std::string& name) {
  for (const auto& t : idx.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string TensorBytes(const fs::path& dir, const BankIndex& idx, const BankIndexTensor& t) {
  return testing::ReadFile(dir / idx.files[t.file].name).substr(t.offset, t.bytes);
}

ConvertOptions Opts(DType experts, std::optional<DType> dense = std::nullopt) {
  ConvertOptions o;
  o.expert_dtype = experts;
  o.dense_dtype = dense;
  o.n_threads = 2;
  return o;
}

const arch::ArchSpec& SpecOf(const fs::path& hf) {
  auto s = OpenModelSource(hf);
  EXPECT_TRUE(s.ok()) << s.message();
  return *s->spec;
}

class QuantizedBanks : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(QuantizedBanks, HoldAnIndependentQuantizationOfTheCheckpoint) {
  const auto& [fixture, dt] = GetParam();
  const fs::path hf = testing::HfFixture(fixture);
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "q";
  auto r = ConvertCheckpoint(hf, dir, Opts(dt));
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->expert_dtype, dt);
  EXPECT_EQ(r->n_dense_converted, 0);

  const auto weights = testing::ReadSafetensors(hf / "model.safetensors");
  const BankIndex idx = ReadIndex(dir);
  ASSERT_EQ(idx.expert_dtype, dt);
  EXPECT_FALSE(idx.dense_dtype.has_value());
  ASSERT_FALSE(idx.banks.empty());
  const BankIndexBank& b0 = idx.banks[0];
  const ExpertLayout lay{b0.d_model, b0.width, dt};
  // The packing the loader assumes, spelled out: gate and up are width rows of d_model, down is
  // d_model rows of width, each row d/32 blocks.
  const uint64_t block = dt == DType::kQ8_0 ? 34 : 18;
  const uint64_t gate_bytes = static_cast<uint64_t>(b0.width * b0.d_model / 32) * block;
  EXPECT_EQ(lay.gate_up_bytes(), gate_bytes);
  EXPECT_EQ(lay.down_bytes(), gate_bytes);  // same weight count; rows differ when d != width
  EXPECT_EQ(lay.down_offset(), 2 * gate_bytes);
  EXPECT_EQ(b0.expert_stride_bytes, (3 * gate_bytes + 4095) / 4096 * 4096);

  const arch::ArchSpec& spec = SpecOf(hf);
  for (const BankIndexBank& b : {idx.banks.front(), idx.banks.back()}) {
    EXPECT_EQ(b.dtype, dt);
    EXPECT_EQ(b.bytes, lay.bank_bytes(b.n_experts));
    const std::string data = testing::ReadFile(dir / idx.files[b.file].name);
    for (int64_t e : {int64_t{0}, b.n_experts - 1}) {
      const uint64_t base = b.offset + static_cast<uint64_t>(e) * b.expert_stride_bytes;
      const std::pair<ExpertMatrix, uint64_t> mats[] = {{ExpertMatrix::kGate, lay.gate_offset()},
                                                        {ExpertMatrix::kUp, lay.up_offset()},
                                                        {ExpertMatrix::kDown, lay.down_offset()}};
      for (const auto& [m, off] : mats) {
        const std::string name = spec.expert_tensor_name(b.layer, e, m);
        const TensorSpec& src = weights.at(name);
        const std::string want = Quantize(src, dt);
        const std::string got = data.substr(base + off, want.size());
        ASSERT_EQ(got, want) << name;
        // Dequantized, each weight is within the quantizer's bound of the source value:
        // |d|/2 for Q8_0; |d| for Q4_0 (elements near -max clamp to code 15: quant.h).
        const int64_t k = src.shape.back();
        const std::vector<float> x = ToFloats(src);
        std::vector<float> w(static_cast<size_t>(k));
        for (size_t r = 0; r < x.size() / static_cast<size_t>(k); ++r) {
          const char* row = got.data() + r * DTypeRowBytes(dt, k);
          if (dt == DType::kQ8_0)
            kernels::DequantizeRowQ8_0(row, k, w.data());
          else
            kernels::DequantizeRowQ4_0(row, k, w.data());
          for (int64_t j = 0; j < k; ++j) {
            uint16_t dbits;
            std::memcpy(&dbits, row + (j / 32) * static_cast<int64_t>(block), 2);
            const float d = std::fabs(F16ToF32(dbits));
            const float bound = (dt == DType::kQ8_0 ? 0.5f : 1.0f) * d * (1 + 1e-6f);
            ASSERT_LE(std::fabs(w[j] - x[r * k + j]), bound) << name << " row " << r << " " << j;
          }
        }
      }
      // Padding to the stride is zeros (checksummed with the rest).
      const std::string pad =
          data.substr(base + lay.expert_bytes(), b.expert_stride_bytes - lay.expert_bytes());
      EXPECT_EQ(pad, std::string(pad.size(), '\0'));
    }
  }
  // Dense tensors untouched (--dense-dtype same).
  for (const auto& t : idx.tensors) {
    EXPECT_EQ(DTypeName(t.dtype), weights.at(t.name).dtype) << t.name;
    EXPECT_EQ(TensorBytes(dir, idx, t), weights.at(t.name).bytes) << t.name;
  }

  // The converted model opens with quantized layouts: banks sized from DTypeRowBytes.
  auto s = OpenModelSource(dir);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->layout.dtype, dt);
  ASSERT_EQ(s->banks.size(), idx.banks.size());
  for (size_t i = 0; i < idx.banks.size(); ++i) EXPECT_EQ(s->banks[i].bytes, idx.banks[i].bytes);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedBanks,
                         ::testing::Combine(::testing::ValuesIn(kFixtures),
                                            ::testing::Values(DType::kQ8_0, DType::kQ4_0)));

TEST(ConvertDenseDtype, QuantizesMatricesButNotRoutersOrNorms) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;
    const fs::path dir = tmp.path() / "q";
    auto r = ConvertCheckpoint(hf, dir, Opts(DType::kQ8_0, DType::kQ8_0));
    ASSERT_TRUE(r.ok()) << r.message();
    const auto weights = testing::ReadSafetensors(hf / "model.safetensors");
    const BankIndex idx = ReadIndex(dir);
    EXPECT_EQ(idx.dense_dtype, DType::kQ8_0);
    const arch::ArchSpec& spec = SpecOf(hf);
    int n_quantized = 0;
    for (const auto& t : idx.tensors) {
      const TensorSpec& src = weights.at(t.name);
      const bool router = t.name == spec.router_tensor_name(0) ||
                          t.name == spec.router_tensor_name(1) ||
                          t.name == spec.router_tensor_name(2);
      if (src.shape.size() == 2 && !router) {
        EXPECT_EQ(t.dtype, DType::kQ8_0) << t.name;
        EXPECT_EQ(TensorBytes(dir, idx, t), Quantize(src, DType::kQ8_0)) << t.name;
        ++n_quantized;
      } else {
        EXPECT_EQ(DTypeName(t.dtype), src.dtype) << t.name;
        EXPECT_EQ(TensorBytes(dir, idx, t), src.bytes) << t.name;
      }
    }
    EXPECT_EQ(r->n_dense_converted, n_quantized);
    // What the rule above relies on: routers and norms exist and kept their bytes.
    for (const std::string& name :
         {spec.router_tensor_name(0), std::string("model.layers.0.input_layernorm.weight"),
          std::string("model.norm.weight"), std::string("model.layers.0.self_attn.q_proj.weight"),
          std::string("model.embed_tokens.weight")})
      ASSERT_NE(FindTensor(idx, name), nullptr) << name;
    EXPECT_EQ(FindTensor(idx, spec.router_tensor_name(0))->dtype, DType::kBF16);
    EXPECT_EQ(FindTensor(idx, "model.norm.weight")->dtype, DType::kBF16);
    EXPECT_EQ(FindTensor(idx, "model.layers.0.self_attn.q_proj.weight")->dtype, DType::kQ8_0);
    EXPECT_EQ(FindTensor(idx, "model.embed_tokens.weight")->dtype, DType::kQ8_0);
  }
}

// Runs `tokens` through the model at `dir` and returns the logits of every position.
struct ModelRun {
  std::vector<float> logits;
  uint64_t decode_bytes = 0;
  DType expert_dtype = DType::kF32;
  std::vector<uint64_t> settled_bytes;
};
ModelRun RunModel(const fs::path& dir, const std::vector<int32_t>& tokens) {
  ModelRun out;
  auto m = LoadCausalLM(dir, testing::WithThreads(2));
  EXPECT_TRUE(m.ok()) << m.message();
  if (!m.ok()) return out;
  KvCache cache = *(*m)->NewCache(64);
  EXPECT_TRUE((*m)->Forward(tokens, cache, LogitsFor::kAllTokens, out.logits).ok());
  out.decode_bytes = (*m)->DecodeBytesPerToken();
  out.expert_dtype = (*m)->expert_dtype();
  for (const auto& l : *(*m)->residency().settled) out.settled_bytes.push_back(l.bytes);
  return out;
}

// Bounds on RelMaxDiff of a quantized model's logits against the bf16 model's, ~3x what these
// fixtures measure (printed by the tests: q8_0 experts 0.34% / 0.68% for qwen3_moe_tiny /
// mixtral, q4_0 experts 4.1% / 7.3%, q8_0 experts and dense matrices 1.3% / 1.1%). Q8_0 rounds
// each weight to 1/127 of its block's largest magnitude, Q4_0 to 1/8 (16x coarser: the measured
// q4_0/q8_0 ratio is 11-12x), and the kernels also round activations to 8 bits per block for
// quantized weights. Quantizing the dense matrices too adds attention and the embedding rows.
// A layout or scale bug moves logits by about their whole range (RelMaxDiff ~ 1).
constexpr double kQ8_0Bound = 0.02;
constexpr double kQ4_0Bound = 0.2;
constexpr double kQ8_0DenseBound = 0.04;

// max |a - b| over the range of a (max - min): the error in units of the logits' spread, so one
// bound serves models whose logits differ in scale.
double RelMaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d / static_cast<double>(*hi - *lo);
}

// One greedy decode step's logits per position: the prompt's last position, then each of
// `forced` fed one at a time through the KV cache (teacher forcing, so two models are compared
// on the same positions even where their choices differ).
std::vector<std::vector<float>> DecodeLogits(const fs::path& dir,
                                             const std::vector<int32_t>& prompt,
                                             const std::vector<int32_t>& forced) {
  auto m = LoadCausalLM(dir, testing::WithThreads(2));
  EXPECT_TRUE(m.ok()) << m.message();
  if (!m.ok()) return {};
  KvCache cache = *(*m)->NewCache(64);
  std::vector<std::vector<float>> out(forced.size() + 1);
  EXPECT_TRUE((*m)->Forward(prompt, cache, LogitsFor::kLastToken, out[0]).ok());
  for (size_t i = 0; i < forced.size(); ++i) {
    const std::vector<int32_t> one = {forced[i]};
    EXPECT_TRUE((*m)->Forward(one, cache, LogitsFor::kLastToken, out[i + 1]).ok());
  }
  return out;
}

int32_t ArgMax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

class QuantizedModels : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedModels, LoadAndStayCloseToBf16) {
  const fs::path hf = testing::HfFixture(GetParam());
  testing::TempDir tmp;
  const std::vector<int32_t> tokens = {3, 17, 42, 7, 99, 1, 250, 311};
  struct Variant {
    const char* name;
    DType experts;
    std::optional<DType> dense;
    double bound;  // on RelMaxDiff against the bf16 model (see kQ8_0Bound)
  };
  const Variant variants[] = {
      {"q8_0 experts", DType::kQ8_0, std::nullopt, kQ8_0Bound},
      {"q4_0 experts", DType::kQ4_0, std::nullopt, kQ4_0Bound},
      {"q8_0 experts and dense", DType::kQ8_0, DType::kQ8_0, kQ8_0DenseBound},
  };
  double q8_diff = 0, q4_diff = 0;
  const ModelRun ref = RunModel(hf, tokens);
  ASSERT_FALSE(ref.logits.empty());
  const auto [lo, hi] = std::minmax_element(ref.logits.begin(), ref.logits.end());
  ASSERT_GT(*hi - *lo, 1.0f);  // a real spread to measure against
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    const fs::path dir = tmp.path() / v.name;
    auto r = ConvertCheckpoint(hf, dir, Opts(v.experts, v.dense));
    ASSERT_TRUE(r.ok()) << r.message();
    const ModelRun q = RunModel(dir, tokens);
    ASSERT_FALSE(q.logits.empty());
    const double diff = RelMaxDiff(ref.logits, q.logits);
    std::printf("[ measured ] %s %s: max |dlogit| / range = %.5f (bound %.3f)\n",
                GetParam().c_str(), v.name, diff, v.bound);
    EXPECT_LE(diff, v.bound);
    EXPECT_GT(diff, 0.0);  // it did quantize
    if (!v.dense) (v.experts == DType::kQ8_0 ? q8_diff : q4_diff) = diff;

    // What bench reports and what residency budgets use.
    EXPECT_EQ(q.expert_dtype, v.experts);
    const BankIndex idx = ReadIndex(dir);
    ASSERT_EQ(q.settled_bytes.size(), idx.banks.size());
    for (size_t i = 0; i < idx.banks.size(); ++i) EXPECT_EQ(q.settled_bytes[i], idx.banks[i].bytes);
    if (!v.dense) {
      // Only the experts changed: the decode floor drops by top-k × the per-expert saving in
      // every MoE layer, the per-expert bytes counted from DTypeRowBytes.
      auto s = OpenModelSource(hf);
      ASSERT_TRUE(s.ok());
      const ExpertLayout a = s->layout, b{a.d_model, a.width, v.experts};
      const uint64_t saved = static_cast<uint64_t>(s->config.n_moe_layers()) *
                             static_cast<uint64_t>(s->config.n_experts_per_token) *
                             (a.expert_bytes() - b.expert_bytes());
      EXPECT_EQ(q.decode_bytes, ref.decode_bytes - saved);
    } else {
      EXPECT_LT(q.decode_bytes, ref.decode_bytes);
    }
  }
  EXPECT_LT(q8_diff, q4_diff);  // 8 bits a weight must beat 4
}

// Greedy decoding through the KV cache. Free-running greedy tokens of the q8_0 model equal the
// bf16 model's on these prompts today (16 of 16 steps per fixture), but not robustly: one step of
// realvocab/qwen3_moe_tiny is a near tie (top-2 gap 0.16% of the logit range, while q8_0 moves
// logits by up to ~0.7%), so any change of rounding in the kernels may flip it and everything
// after. So the test feeds both models the bf16 model's greedy tokens and asserts (1) the logit
// bound at every decode step and (2) the same choice wherever the bf16 top-2 gap exceeds twice
// that bound (there the bound leaves no room for a flip); it prints how many steps agree.
TEST_P(QuantizedModels, Q8_0DecodeStepsFollowBf16) {
  const fs::path hf = testing::HfFixture(GetParam());
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "q8";
  auto r = ConvertCheckpoint(hf, dir, Opts(DType::kQ8_0));
  ASSERT_TRUE(r.ok()) << r.message();
  int n_steps = 0, n_agree = 0, n_clear = 0;
  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{3, 17, 42, 7}, std::vector<int32_t>{99, 1, 250}}) {
    // The bf16 model's greedy continuation, then both models' logits along it.
    std::vector<int32_t> greedy;
    {
      auto m = LoadCausalLM(hf, testing::WithThreads(2));
      ASSERT_TRUE(m.ok()) << m.message();
      KvCache cache = *(*m)->NewCache(64);
      std::vector<int32_t> in = prompt;
      std::vector<float> logits;
      for (int i = 0; i < 8; ++i) {
        ASSERT_TRUE((*m)->Forward(in, cache, LogitsFor::kLastToken, logits).ok());
        greedy.push_back(ArgMax(logits));
        in = {greedy.back()};
      }
    }
    const std::vector<int32_t> forced(greedy.begin(), greedy.end() - 1);
    const auto want = DecodeLogits(hf, prompt, forced);
    const auto got = DecodeLogits(dir, prompt, forced);
    ASSERT_EQ(want.size(), greedy.size());
    ASSERT_EQ(got.size(), greedy.size());
    for (size_t i = 0; i < greedy.size(); ++i) {
      ASSERT_EQ(ArgMax(want[i]), greedy[i]);
      const auto [lo, hi] = std::minmax_element(want[i].begin(), want[i].end());
      const double range = static_cast<double>(*hi - *lo);
      EXPECT_LE(RelMaxDiff(want[i], got[i]), kQ8_0Bound) << "step " << i;
      std::vector<float> top = want[i];
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      const bool clear = static_cast<double>(top[0] - top[1]) > 2 * kQ8_0Bound * range;
      if (clear) {
        EXPECT_EQ(ArgMax(got[i]), greedy[i]) << "step " << i << ": a clear choice flipped";
      }
      ++n_steps;
      n_clear += clear ? 1 : 0;
      n_agree += ArgMax(got[i]) == greedy[i] ? 1 : 0;
    }
  }
  std::printf("[ measured ] %s q8_0 greedy: %d of %d decode steps agree (%d clear)\n",
              GetParam().c_str(), n_agree, n_steps, n_clear);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedModels, ::testing::ValuesIn(kFixtures));

TEST(ConvertQuantErrors, ExpertWidthNotAMultipleOf32) {
  // qwen3_moe: hidden 64 (fine), expert width 48: the down rows cannot be whole blocks.
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    testing::TempDir tmp;
    const fs::path dir = tmp.path() / "q";
    auto r = ConvertCheckpoint(testing::HfFixture("qwen3_moe"), dir, Opts(dt));
    ASSERT_FALSE(r.ok());
    const std::string& e = r.message();
    for (const std::string& needle :
         {std::string("model.layers.0.mlp.experts.0.down_proj.weight"), std::string("48"),
          std::string(DTypeName(dt)), std::string("--dtype bf16")})
      EXPECT_NE(e.find(needle), std::string::npos) << "missing '" << needle << "' in: " << e;
    EXPECT_FALSE(fs::exists(dir)) << "nothing may be written before the check";
  }
  // The dense matrices of that model are fine to quantize (rows of 64 and 128): only the
  // experts' rows decide.
  testing::TempDir tmp;
  auto r = ConvertCheckpoint(testing::HfFixture("qwen3_moe"), tmp.path() / "d",
                             Opts(DType::kBF16, DType::kQ8_0));
  EXPECT_TRUE(r.ok()) << r.message();
}

// What a conversion wrote, comparable: the index minus file names, and every tensor's and bank's
// bytes.
struct Written {
  BankIndex index;
  std::map<std::string, std::string> bytes;  // tensor name or "bank <layer>" -> bytes
};
Written ReadWritten(const fs::path& dir) {
  Written w;
  w.index = ReadIndex(dir);
  for (const auto& t : w.index.tensors) w.bytes[t.name] = TensorBytes(dir, w.index, t);
  for (const auto& b : w.index.banks)
    w.bytes["bank " + std::to_string(b.layer)] =
        testing::ReadFile(dir / w.index.files[b.file].name).substr(b.offset, b.bytes);
  return w;
}

// A bf16 conversion converts again (`--model` a converted directory) into exactly what the
// checkpoint converts into directly, for every target, dense dtype included: the fixtures are
// bf16, so the bf16 banks hold the checkpoint's values unchanged.
TEST(ConvertFromConverted, EqualsConvertingTheCheckpoint) {
  for (const std::string& fixture : kFixtures) {
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;
    ASSERT_TRUE(ConvertCheckpoint(hf, tmp.path() / "bf16", Opts(DType::kBF16)).ok());
    for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
      for (std::optional<DType> dense : {std::optional<DType>(), std::optional<DType>(dt)}) {
        SCOPED_TRACE(fixture + " " + std::string(DTypeName(dt)) + (dense ? " dense" : ""));
        const std::string tag = std::string(DTypeName(dt)) + (dense ? "d" : "");
        auto direct = ConvertCheckpoint(hf, tmp.path() / ("direct" + tag), Opts(dt, dense));
        ASSERT_TRUE(direct.ok()) << direct.message();
        auto again =
            ConvertCheckpoint(tmp.path() / "bf16", tmp.path() / ("again" + tag), Opts(dt, dense));
        ASSERT_TRUE(again.ok()) << again.message();
        EXPECT_EQ(again->n_dense_converted, direct->n_dense_converted);
        const Written a = ReadWritten(tmp.path() / ("direct" + tag));
        const Written b = ReadWritten(tmp.path() / ("again" + tag));
        EXPECT_EQ(b.index.expert_dtype, a.index.expert_dtype);
        EXPECT_EQ(b.index.dense_dtype, a.index.dense_dtype);
        ASSERT_EQ(b.index.banks.size(), a.index.banks.size());
        for (size_t i = 0; i < a.index.banks.size(); ++i) {
          EXPECT_EQ(b.index.banks[i].xxh64, a.index.banks[i].xxh64);
          EXPECT_EQ(b.index.banks[i].expert_stride_bytes, a.index.banks[i].expert_stride_bytes);
        }
        ASSERT_EQ(b.bytes.size(), a.bytes.size());
        for (const auto& [name, bytes] : a.bytes) {
          ASSERT_TRUE(b.bytes.count(name)) << name;
          EXPECT_TRUE(b.bytes.at(name) == bytes) << name;
        }
        // The side files came along and the result loads.
        EXPECT_TRUE(fs::exists(tmp.path() / ("again" + tag) / "config.json"));
        EXPECT_TRUE(LoadCausalLM(tmp.path() / ("again" + tag), testing::WithThreads(1)).ok());
      }
    }
  }
}

// Quantized weights are never quantized again, and a damaged source is an error, not a model.
TEST(ConvertFromConverted, RefusesQuantizedSourcesAndDamagedBanks) {
  const fs::path hf = testing::HfFixture("mixtral");
  testing::TempDir tmp;
  ASSERT_TRUE(ConvertCheckpoint(hf, tmp.path() / "q8", Opts(DType::kQ8_0)).ok());
  auto r = ConvertCheckpoint(tmp.path() / "q8", tmp.path() / "q4", Opts(DType::kQ4_0));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("experts are Q8_0"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("Hugging Face checkpoint"), std::string::npos) << r.message();
  // Into the same dtype the experts are copied, and the dense matrices may still be quantized:
  // the same bytes as quantizing both from the checkpoint.
  auto copy =
      ConvertCheckpoint(tmp.path() / "q8", tmp.path() / "q8d", Opts(DType::kQ8_0, DType::kQ8_0));
  ASSERT_TRUE(copy.ok()) << copy.message();
  ASSERT_TRUE(
      ConvertCheckpoint(hf, tmp.path() / "q8d_direct", Opts(DType::kQ8_0, DType::kQ8_0)).ok());
  const Written copied = ReadWritten(tmp.path() / "q8d");
  const Written direct = ReadWritten(tmp.path() / "q8d_direct");
  EXPECT_EQ(copied.index.dense_dtype, DType::kQ8_0);
  EXPECT_TRUE(copied.bytes == direct.bytes);

  // Dense q8_0 kept with --dense-dtype same (and recorded so); asking for another is refused.
  ASSERT_TRUE(ConvertCheckpoint(hf, tmp.path() / "bd", Opts(DType::kBF16, DType::kQ8_0)).ok());
  auto same = ConvertCheckpoint(tmp.path() / "bd", tmp.path() / "bd8", Opts(DType::kQ8_0));
  ASSERT_TRUE(same.ok()) << same.message();
  EXPECT_EQ(ReadIndex(tmp.path() / "bd8").dense_dtype, DType::kQ8_0);
  EXPECT_TRUE(LoadCausalLM(tmp.path() / "bd8", testing::WithThreads(1)).ok());
  auto twice =
      ConvertCheckpoint(tmp.path() / "bd", tmp.path() / "bd4", Opts(DType::kQ8_0, DType::kQ4_0));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("quantize it twice"), std::string::npos) << twice.message();

  // One flipped byte in the last bank: the conversion stops, naming the data file and layer.
  ASSERT_TRUE(ConvertCheckpoint(hf, tmp.path() / "bf16", Opts(DType::kBF16)).ok());
  const BankIndex idx = ReadIndex(tmp.path() / "bf16");
  const BankIndexBank& last = idx.banks.back();
  const fs::path data = tmp.path() / "bf16" / idx.files[last.file].name;
  std::string bytes = testing::ReadFile(data);
  bytes[last.offset + last.bytes / 2] ^= 0x40;
  testing::WriteFile(data, bytes);
  auto bad = ConvertCheckpoint(tmp.path() / "bf16", tmp.path() / "bad", Opts(DType::kQ8_0));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find(idx.files[last.file].name), std::string::npos) << bad.message();
  EXPECT_NE(bad.message().find("layer " + std::to_string(last.layer)), std::string::npos)
      << bad.message();
  EXPECT_NE(bad.message().find("checksum"), std::string::npos) << bad.message();
  EXPECT_FALSE(fs::exists(tmp.path() / "bad" / kBankIndexFileName));
}

// The index is what allows weights that differ from config.json's torch_dtype: without its
// record of the conversion, the strict check applies as for a Hugging Face checkpoint.
TEST(ConvertQuantErrors, IndexWithoutConversionRecordIsRefused) {
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "q";
  auto r = ConvertCheckpoint(testing::HfFixture("mixtral"), dir, Opts(DType::kQ8_0, DType::kQ8_0));
  ASSERT_TRUE(r.ok()) << r.message();
  const std::string text = testing::ReadFile(dir / kBankIndexFileName);
  for (const char* key : {"expert_dtype", "dense_dtype"}) {
    SCOPED_TRACE(key);
    nlohmann::json j = nlohmann::json::parse(text);
    j.erase(key);
    testing::WriteFile(dir / kBankIndexFileName, j.dump(1));
    auto m = LoadCausalLM(dir, testing::WithThreads(1));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.message().find("is Q8_0 but"), std::string::npos) << m.message();
    EXPECT_NE(m.message().find("declares BF16"), std::string::npos) << m.message();
  }
  testing::WriteFile(dir / kBankIndexFileName, text);
  EXPECT_TRUE(LoadCausalLM(dir, testing::WithThreads(1)).ok());
}

// convert never quantizes a norm, and the loader reads norms as floats: an index that says
// otherwise is an error naming the tensor, never a norm of zeros.
TEST(ConvertQuantErrors, QuantizedNormIsRefused) {
  testing::TempDir tmp;
  const fs::path dir = tmp.path() / "q";
  auto r = ConvertCheckpoint(testing::HfFixture("mixtral"), dir, Opts(DType::kQ8_0, DType::kQ8_0));
  ASSERT_TRUE(r.ok()) << r.message();
  nlohmann::json j = nlohmann::json::parse(testing::ReadFile(dir / kBankIndexFileName));
  for (auto& t : j["tensors"])
    if (t["name"] == "model.norm.weight") {
      t["dtype"] = "Q8_0";
      t["bytes"] = 2 * 34;  // [64] as two Q8_0 blocks
    }
  testing::WriteFile(dir / kBankIndexFileName, j.dump(1));
  LoadOptions o = testing::WithThreads(1);
  o.residency.verify = false;  // the checksum would catch this edit first
  auto m = LoadCausalLM(dir, o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("tensor 'model.norm.weight' is Q8_0; norms and biases must be"),
            std::string::npos)
      << m.message();
}

TEST(ConvertQuantCli, DtypeFlags) {
  auto bad = testing::RunCli("convert -m x -o y --dtype q5_k");
  EXPECT_NE(bad.exit_code, 0);
  for (const char* needle : {"--dtype", "q5_k", "bf16", "q8_0", "q4_0"})
    EXPECT_NE(bad.err.find(needle), std::string::npos) << needle << " in: " << bad.err;
  auto bad_dense = testing::RunCli("convert -m x -o y --dense-dtype f16");
  EXPECT_NE(bad_dense.exit_code, 0);
  EXPECT_NE(bad_dense.err.find("same"), std::string::npos) << bad_dense.err;

  testing::TempDir tmp;
  const fs::path out = tmp.path() / "q4";
  auto ok =
      testing::RunCli("convert -m '" + testing::HfFixture("realvocab/qwen3_moe_tiny").string() +
                      "' -o '" + out.string() + "' --dtype q4_0 --dense-dtype q8_0 -t 2");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("expert banks (Q4_0)"), std::string::npos) << ok.err;
  const BankIndex idx = ReadIndex(out);
  EXPECT_EQ(idx.expert_dtype, DType::kQ4_0);
  EXPECT_EQ(idx.dense_dtype, DType::kQ8_0);
  auto gen = testing::RunCli("generate -m '" + out.string() + "' --tokens 3,17,42 -n 4");
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
}

}  // namespace
}  // namespace moetier
