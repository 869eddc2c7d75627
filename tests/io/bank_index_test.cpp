// The bank index with block-quantized dtypes: Q8_0 / Q4_0 tensors and banks parse and serialize,
// their byte lengths are rows × DTypeRowBytes (never elements × DTypeSize, which is 0 for them),
// and a length that disagrees is an error naming the tensor or bank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "io/bank_index.h"

namespace moetier {
namespace {

using nlohmann::json;

// A valid index: one tensor `t` of `dtype` and `shape`, one bank of layer 0 (n_experts 2,
// d_model 64, width 96), each placed in one data file.
json Index(const std::string& dtype, std::vector<int64_t> shape, uint64_t tensor_bytes,
           const std::string& bank_dtype, uint64_t stride) {
  json j;
  j["format"] = "moetier-bank";
  j["version"] = kBankFormatVersion;
  j["architecture"] = "MixtralForCausalLM";
  j["files"] = json::array({{{"name", "data-00000.bin"}, {"bytes", 1u << 20}}});
  j["tensors"] = json::array({{{"name", "t"},
                               {"dtype", dtype},
                               {"shape", shape},
                               {"file", 0},
                               {"offset", 0},
                               {"bytes", tensor_bytes},
                               {"xxh64", "0123456789abcdef"}}});
  j["banks"] = json::array({{{"layer", 0},
                             {"dtype", bank_dtype},
                             {"n_experts", 2},
                             {"width", 96},
                             {"d_model", 64},
                             {"expert_stride_bytes", stride},
                             {"file", 0},
                             {"offset", 65536},
                             {"bytes", 2 * stride},
                             {"xxh64", "0000000000000000"}}});
  return j;
}

// gate and up: 96 rows of 64 (2 blocks); down: 64 rows of 96 (3 blocks).
constexpr uint64_t kQ8Expert = 2 * 96 * (2 * 34) + 64 * (3 * 34);  // 19584
constexpr uint64_t kQ4Expert = 2 * 96 * (2 * 18) + 64 * (3 * 18);  // 10368

std::string ParseError(const json& j) {
  auto r = ParseBankIndex(j.dump(), "idx.json");
  if (r.ok()) return "";
  EXPECT_EQ(r.message().rfind("idx.json: ", 0), 0u) << r.message();
  return r.message();
}

TEST(BankIndexQuant, QuantizedTensorsAndBanksParseAndRoundTrip) {
  // [3, 64] Q8_0: 3 rows × 2 blocks × 34 bytes; Q4_0: 3 × 2 × 18.
  for (const auto& [dtype, bytes, expert] :
       {std::tuple<std::string, uint64_t, uint64_t>{"Q8_0", 3 * 68, kQ8Expert},
        std::tuple<std::string, uint64_t, uint64_t>{"Q4_0", 3 * 36, kQ4Expert}}) {
    SCOPED_TRACE(dtype);
    const uint64_t stride = (expert + 4095) / 4096 * 4096;
    json j = Index(dtype, {3, 64}, bytes, dtype, stride);
    j["expert_dtype"] = dtype;
    j["dense_dtype"] = dtype;
    auto idx = ParseBankIndex(j.dump(), "idx.json");
    ASSERT_TRUE(idx.ok()) << idx.message();
    EXPECT_EQ(DTypeName(idx->tensors[0].dtype), dtype);
    EXPECT_EQ(DTypeName(idx->banks[0].dtype), dtype);
    ASSERT_TRUE(idx->expert_dtype && idx->dense_dtype);
    EXPECT_EQ(DTypeName(*idx->expert_dtype), dtype);
    EXPECT_EQ(DTypeName(*idx->dense_dtype), dtype);

    const std::string text = SerializeBankIndex(*idx);
    auto again = ParseBankIndex(text, "again.json");
    ASSERT_TRUE(again.ok()) << again.message();
    EXPECT_EQ(SerializeBankIndex(*again), text);
    EXPECT_EQ(json::parse(text)["expert_dtype"], dtype);
  }
  // Without the optional records (indexes written before quantization existed).
  auto old = ParseBankIndex(Index("BF16", {3, 64}, 384, "BF16", 40960).dump(), "idx.json");
  ASSERT_TRUE(old.ok()) << old.message();
  EXPECT_FALSE(old->expert_dtype.has_value());
  EXPECT_FALSE(json::parse(SerializeBankIndex(*old)).contains("expert_dtype"));
}

TEST(BankIndexQuant, WrongTensorLengthNamesTheTensor) {
  // 384 = 3 × 64 × 2: the bf16 length, wrong for Q8_0.
  const std::string e = ParseError(Index("Q8_0", {3, 64}, 384, "BF16", 40960));
  EXPECT_NE(e.find("tensor 't'"), std::string::npos) << e;
  EXPECT_NE(e.find("needs 204 bytes, index says 384"), std::string::npos) << e;
  const std::string e4 = ParseError(Index("Q4_0", {3, 64}, 3 * 68, "BF16", 40960));
  EXPECT_NE(e4.find("tensor 't'"), std::string::npos) << e4;
  EXPECT_NE(e4.find("needs 108 bytes"), std::string::npos) << e4;
  // Rows that are not whole blocks, and a quantized scalar.
  const std::string rows = ParseError(Index("Q8_0", {3, 48}, 3 * 51, "BF16", 40960));
  EXPECT_NE(rows.find("tensor 't': row length 48 is not a multiple of 32"), std::string::npos)
      << rows;
  const std::string scalar = ParseError(Index("Q8_0", {}, 34, "BF16", 40960));
  EXPECT_NE(scalar.find("tensor 't'"), std::string::npos) << scalar;
}

TEST(BankIndexQuant, WrongBankLengthNamesTheBank) {
  // What a writer sizing experts with DTypeSize (0 for Q8_0) would record: a zero stride.
  const std::string zero = ParseError(Index("F32", {2}, 8, "Q8_0", 0));
  EXPECT_NE(zero.find("bank of layer 0"), std::string::npos) << zero;
  EXPECT_NE(zero.find("holding 19584 bytes"), std::string::npos) << zero;
  // The bf16 stride is large enough but bytes must still be n_experts × stride.
  json j = Index("F32", {2}, 8, "Q4_0", 12288);
  j["banks"][0]["bytes"] = 12288;
  const std::string bytes = ParseError(j);
  EXPECT_NE(bytes.find("bank of layer 0: bytes 12288"), std::string::npos) << bytes;
  // A stride whose product with n_experts wraps around 2^64 to exactly `bytes`: 2 × (2^63 +
  // 4096) = 8192 (mod 2^64). Accepting it would put expert 1 2^63 bytes past the bank.
  json wrap = Index("F32", {2}, 8, "Q8_0", (1ull << 63) + 4096);
  wrap["banks"][0]["bytes"] = 8192;
  const std::string w2 = ParseError(wrap);
  EXPECT_NE(w2.find("bank of layer 0: bytes 8192 != n_experts"), std::string::npos) << w2;
  // Too small a stride for Q8_0 (fits Q4_0's 10368 bytes, not Q8_0's 19584).
  const std::string small = ParseError(Index("F32", {2}, 8, "Q8_0", 12288));
  EXPECT_NE(small.find("bank of layer 0"), std::string::npos) << small;
  // Rows of a quantized bank must be whole blocks.
  json odd = Index("F32", {2}, 8, "Q8_0", 40960);
  odd["banks"][0]["width"] = 48;
  const std::string w = ParseError(odd);
  EXPECT_NE(w.find("bank of layer 0: width 48 is not a multiple of 32"), std::string::npos) << w;
}

TEST(BankIndexQuant, DtypeRecordsAreChecked) {
  json j = Index("F32", {2}, 8, "Q8_0", 20480);
  j["expert_dtype"] = "Q4_0";
  const std::string e = ParseError(j);
  EXPECT_NE(e.find("bank of layer 0: dtype Q8_0 contradicts 'expert_dtype' Q4_0"),
            std::string::npos)
      << e;
  j["expert_dtype"] = "Q5_K";
  const std::string bad = ParseError(j);
  EXPECT_NE(bad.find("expert_dtype \"Q5_K\" is not BF16, F16, F32, Q8_0, Q4_0 or BF16C"),
            std::string::npos)
      << bad;
  // Non-weight dtypes stay refused, quantized or not.
  const std::string i8 = ParseError(Index("I8", {2}, 2, "Q8_0", 20480));
  EXPECT_NE(i8.find("tensor 't': dtype \"I8\""), std::string::npos) << i8;
}

// The fuzzer's seed for quantized indexes must be an accepted index, or it seeds only errors.
TEST(BankIndexQuant, FuzzSeedIsValid) {
  const std::filesystem::path seed = std::filesystem::path(MOETIER_FIXTURES_DIR) / ".." / ".." /
                                     "fuzz" / "corpus" / "bank_index" / "q8_0.json";
  std::ifstream in(seed);
  ASSERT_TRUE(in) << seed;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto idx = ParseBankIndex(text, seed.string());
  ASSERT_TRUE(idx.ok()) << idx.message();
  EXPECT_EQ(idx->expert_dtype, DType::kQ8_0);
}

}  // namespace
}  // namespace moetier
