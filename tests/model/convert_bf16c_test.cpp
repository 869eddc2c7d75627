// moetier convert --dtype bf16c / --dense-dtype bf16c: every packed row unpacks to exactly the
// checkpoint's bf16 bits; the model computes bf16's logits (bit for bit where bf16 and bf16c run
// the same kernels, the AVX2 and scalar levels); a bf16c conversion converts back to the bf16
// one byte for byte; a row BF16C cannot hold is an error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/dtype.h"
#include "experts/expert_layout.h"
#include "io/bank_index.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/cpu_isa.h"
#include "model/arch/arch.h"
#include "model/causal_lm.h"
#include "model/convert.h"
#include "model/model_source.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;
using testing::TensorSpec;

const std::string kFixtures[] = {"realvocab/qwen3_moe_tiny", "mixtral"};

ConvertOptions Opts(DType experts, std::optional<DType> dense = std::nullopt) {
  ConvertOptions o;
  o.expert_dtype = experts;
  o.dense_dtype = dense;
  o.n_threads = 2;
  return o;
}

BankIndex ReadIndex(const fs::path& dir) {
  auto idx = ParseBankIndex(testing::ReadFile(dir / kBankIndexFileName), "index");
  EXPECT_TRUE(idx.ok()) << idx.message();
  return idx.ok() ? *idx : BankIndex{};
}

// The rows of packed `bytes` ([rows, k] BF16C) unpacked to bf16 bits, as raw bytes.
std::string Unpack(const std::string& bytes, int64_t k) {
  const size_t row = DTypeRowBytes(DType::kBF16C, k);
  std::string out(bytes.size() / row * static_cast<size_t>(k) * 2, '\0');
  for (size_t r = 0; r < bytes.size() / row; ++r)
    kernels::UnpackRowBf16c(reinterpret_cast<const uint8_t*>(bytes.data()) + r * row, k,
                            reinterpret_cast<uint16_t*>(out.data()) + r * static_cast<size_t>(k));
  return out;
}

std::vector<float> Logits(const fs::path& dir, const std::vector<int32_t>& tokens,
                          uint64_t* decode_bytes = nullptr) {
  auto m = LoadCausalLM(dir, testing::WithThreads(2));
  EXPECT_TRUE(m.ok()) << m.message();
  if (!m.ok()) return {};
  KvCache cache = *(*m)->NewCache(64);
  std::vector<float> logits;
  EXPECT_TRUE((*m)->Forward(tokens, cache, LogitsFor::kAllTokens, logits).ok());
  if (decode_bytes != nullptr) *decode_bytes = (*m)->DecodeBytesPerToken();
  return logits;
}

TEST(ConvertBf16c, BanksUnpackToTheCheckpointsBits) {
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;
    const fs::path dir = tmp.path() / "c";
    auto r = ConvertCheckpoint(hf, dir, Opts(DType::kBF16C, DType::kBF16C));
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(r->expert_dtype, DType::kBF16C);
    const auto weights = testing::ReadSafetensors(hf / "model.safetensors");
    const BankIndex idx = ReadIndex(dir);
    ASSERT_EQ(idx.expert_dtype, DType::kBF16C);
    ASSERT_FALSE(idx.banks.empty());
    auto s = OpenModelSource(hf);
    ASSERT_TRUE(s.ok()) << s.message();
    for (const BankIndexBank& b : idx.banks) {
      const ExpertLayout lay{b.d_model, b.width, DType::kBF16C};
      EXPECT_EQ(b.bytes, lay.bank_bytes(b.n_experts));
      const std::string data = testing::ReadFile(dir / idx.files[b.file].name);
      for (int64_t e = 0; e < b.n_experts; ++e) {
        const uint64_t base = b.offset + static_cast<uint64_t>(e) * b.expert_stride_bytes;
        const std::pair<ExpertMatrix, uint64_t> mats[] = {{ExpertMatrix::kGate, lay.gate_offset()},
                                                          {ExpertMatrix::kUp, lay.up_offset()},
                                                          {ExpertMatrix::kDown, lay.down_offset()}};
        for (const auto& [m, off] : mats) {
          const std::string name = s->spec->expert_tensor_name(b.layer, e, m);
          const TensorSpec& src = weights.at(name);
          ASSERT_EQ(src.dtype, "BF16");
          const int64_t k = src.shape.back();
          const size_t n = static_cast<size_t>(src.shape.front()) * DTypeRowBytes(DType::kBF16C, k);
          ASSERT_EQ(Unpack(data.substr(base + off, n), k), src.bytes) << name;
        }
      }
    }
    // Dense matrices: rows of <= 128 (every one in these fixtures) would grow, so they stay.
    for (const auto& t : idx.tensors) {
      EXPECT_EQ(DTypeName(t.dtype), weights.at(t.name).dtype) << t.name;
      EXPECT_LE(t.shape.back(), 128) << t.name;
    }
  }
}

TEST(ConvertBf16c, ComputesBf16sLogitsAndConvertsBack) {
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 7, 3, 11, 4};
  using kernels::CpuIsa;
  const CpuIsa isa = kernels::ActiveCpuIsa();
  // bf16 and bf16c run the very same arithmetic on these levels (matmul_avx2_impl.h); on the
  // AVX-512 ones bf16 has its own kernels, which sum in another order.
  const bool same_kernels =
      isa == CpuIsa::kScalar || isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvxVnni;
  for (const std::string& fixture : kFixtures) {
    SCOPED_TRACE(fixture);
    const fs::path hf = testing::HfFixture(fixture);
    testing::TempDir tmp;
    ASSERT_TRUE(ConvertCheckpoint(hf, tmp.path() / "b", Opts(DType::kBF16)).ok());
    auto c = ConvertCheckpoint(hf, tmp.path() / "c", Opts(DType::kBF16C));
    ASSERT_TRUE(c.ok()) << c.message();
    uint64_t bytes_b = 0, bytes_c = 0;
    const std::vector<float> lb = Logits(tmp.path() / "b", tokens, &bytes_b);
    const std::vector<float> lc = Logits(tmp.path() / "c", tokens, &bytes_c);
    ASSERT_EQ(lb.size(), lc.size());
    ASSERT_FALSE(lb.empty());
    if (same_kernels) {
      EXPECT_EQ(0, std::memcmp(lb.data(), lc.data(), lb.size() * sizeof(float)));
    } else {
      // fp32 sums in another order; on the AVX-512 BF16 level bf16's kernels also round the
      // activations to bf16 (2^-9 relative; 3.4e-3 of the range measured on mixtral).
      const double share = isa == CpuIsa::kAvx512Bf16 ? 1e-2 : 1e-4;
      const auto [lo, hi] = std::minmax_element(lb.begin(), lb.end());
      for (size_t i = 0; i < lb.size(); ++i) ASSERT_NEAR(lb[i], lc[i], share * (*hi - *lo)) << i;
    }
    // The bytes a decoded token streams are the packed rows' (here larger: rows of 32-96
    // elements, where the 64-byte header outweighs what packing saves).
    EXPECT_NE(bytes_b, bytes_c);

    // Back to bf16 from the bf16c conversion: byte for byte the bf16 conversion's banks.
    ASSERT_TRUE(ConvertCheckpoint(tmp.path() / "c", tmp.path() / "b2", Opts(DType::kBF16)).ok());
    const BankIndex ib = ReadIndex(tmp.path() / "b"), ib2 = ReadIndex(tmp.path() / "b2");
    ASSERT_EQ(ib.banks.size(), ib2.banks.size());
    for (size_t i = 0; i < ib.banks.size(); ++i) EXPECT_EQ(ib.banks[i].xxh64, ib2.banks[i].xxh64);
  }
}

TEST(ConvertBf16c, ARowItCannotHoldIsAnErrorNamingIt) {
  testing::TempDir tmp;
  const fs::path hf = tmp.path() / "hf";
  testing::CopyDir(testing::HfFixture("realvocab/qwen3_moe_tiny"), hf);
  auto tensors = testing::ReadSafetensors(hf / "model.safetensors");
  auto s = OpenModelSource(hf);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::string name = s->spec->expert_tensor_name(1, 2, ExpertMatrix::kUp);
  TensorSpec& t = tensors.at(name);
  const int64_t k = t.shape.back();
  ASSERT_GE(k, 32);
  // Row 3: 32 distinct high bytes (±4^i): 16 fit the table, the other 16 exceed the 12
  // exceptions a row may have.
  for (int64_t j = 0; j < 32; ++j) {
    const float v = (j % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f, 2 * static_cast<int>(j / 2) - 16);
    const uint16_t h = F32ToBf16(v);
    std::memcpy(t.bytes.data() + 2 * (3 * k + j), &h, 2);
  }
  testing::WriteSafetensors(hf / "model.safetensors", tensors);
  auto r = ConvertCheckpoint(hf, tmp.path() / "c", Opts(DType::kBF16C));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("model.safetensors"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("'" + name + "' row 3 "), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("--dtype bf16"), std::string::npos) << r.message();
  EXPECT_FALSE(fs::exists(tmp.path() / "c" / kBankIndexFileName));
  // bf16 takes the same checkpoint.
  EXPECT_TRUE(ConvertCheckpoint(hf, tmp.path() / "b", Opts(DType::kBF16)).ok());
}

}  // namespace
}  // namespace moetier
