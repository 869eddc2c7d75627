// GGUF Q8_0 / Q4_0 blocks: byte layout pinned by hand-built blocks, the reference quantizer's
// round-trip error on fresh random rows, exact values staying exact, and the dtype helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "support/seed.h"

namespace moetier {
namespace {

using kernels::BlockQ4_0;
using kernels::BlockQ8_0;

float ScaleOf(const void* block) {
  uint16_t h;
  std::memcpy(&h, block, 2);
  return F16ToF32(h);
}

TEST(QuantDType, SizesNamesAndParsing) {
  EXPECT_TRUE(IsBlockQuantized(DType::kQ8_0));
  EXPECT_TRUE(IsBlockQuantized(DType::kQ4_0));
  EXPECT_FALSE(IsBlockQuantized(DType::kBF16));
  EXPECT_EQ(DTypeSize(DType::kQ8_0), 0u);  // no per-element size
  EXPECT_EQ(DTypeBlockElements(DType::kQ4_0), 32);
  EXPECT_EQ(DTypeBlockBytes(DType::kQ8_0), 34u);
  EXPECT_EQ(DTypeBlockBytes(DType::kQ4_0), 18u);
  EXPECT_EQ(DTypeRowBytes(DType::kQ8_0, 2048), 64u * 34u);
  EXPECT_EQ(DTypeRowBytes(DType::kQ4_0, 768), 24u * 18u);
  EXPECT_EQ(DTypeRowBytes(DType::kBF16, 7), 14u);
  EXPECT_TRUE(IsValidRowLength(DType::kQ4_0, 64));
  EXPECT_FALSE(IsValidRowLength(DType::kQ4_0, 48));
  EXPECT_TRUE(IsValidRowLength(DType::kF32, 7));
  EXPECT_EQ(DTypeName(DType::kQ8_0), "Q8_0");
  EXPECT_EQ(DTypeName(DType::kQ4_0), "Q4_0");
  EXPECT_TRUE(IsWeightDType(DType::kQ8_0));
  EXPECT_TRUE(IsWeightDType(DType::kQ4_0));
  EXPECT_FALSE(IsWeightDType(DType::kI8));
  // safetensors has no such dtypes: a header claiming one must not parse.
  EXPECT_FALSE(DTypeFromSafetensorsName("Q8_0").has_value());
  EXPECT_FALSE(DTypeFromSafetensorsName("Q4_0").has_value());
  EXPECT_EQ(DTypeFromName("Q8_0"), DType::kQ8_0);
  EXPECT_EQ(DTypeFromName("Q4_0"), DType::kQ4_0);
  EXPECT_EQ(DTypeFromName("BF16"), DType::kBF16);
  EXPECT_FALSE(DTypeFromName("Q5_0").has_value());
}

TEST(QuantFormat, HandBuiltBlocksDecodeAsGguf) {
  // Q8_0: fp16 scale 0.5 (0x3800) little-endian, then int8 codes.
  uint8_t q8[34];
  q8[0] = 0x00;
  q8[1] = 0x38;
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  float out[32];
  kernels::DequantizeRowQ8_0(q8, 32, out);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.5f * static_cast<float>(j * 8 - 128)) << j;

  // Q4_0: scale 2.0 (0x4000); byte j's low nibble is weight j, its high nibble weight j + 16,
  // each offset by 8.
  uint8_t q4[18];
  q4[0] = 0x00;
  q4[1] = 0x40;
  for (int j = 0; j < 16; ++j) q4[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  kernels::DequantizeRowQ4_0(q4, 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(out[j + 16], 2.0f * static_cast<float>(7 - j)) << j;
  }
}

// Fresh random rows, several scales; error bounds from quant.h's contract:
// Q8_0 |x - w| <= |d|/2, Q4_0 |x - w| <= |d|/2 except clamped top codes, which may be off by
// |d| (8 / (1 - 2^-11) - 7): fp16's rounding of m / -8 lets |m| reach 8|d| (1 + 2^-11 + ...).
// The slack 2^-22 |x| covers the one rounding of x / d before round-half-even.
TEST(QuantFormat, RoundTripErrorWithinTheBlockStep) {
  std::mt19937 rng(testing::TestSeed());
  for (float sigma : {1e-3f, 1.0f, 300.0f}) {
    std::normal_distribution<float> dist(0.0f, sigma);
    const int64_t k = 32 * 40;
    std::vector<float> x(k), back(k);
    for (float& v : x) v = dist(rng);
    x[5] = 0.0f;

    std::vector<uint8_t> q8(static_cast<size_t>(k / 32) * 34);
    kernels::QuantizeRowQ8_0(x.data(), k, q8.data());
    kernels::DequantizeRowQ8_0(q8.data(), k, back.data());
    for (int64_t i = 0; i < k; ++i) {
      const float d = ScaleOf(q8.data() + (i / 32) * 34);
      ASSERT_LE(std::fabs(x[i] - back[i]), 0.5f * std::fabs(d) + 0x1p-22f * std::fabs(x[i]))
          << "Q8_0 sigma " << sigma << " i " << i;
    }

    std::vector<uint8_t> q4(static_cast<size_t>(k / 32) * 18);
    kernels::QuantizeRowQ4_0(x.data(), k, q4.data());
    kernels::DequantizeRowQ4_0(q4.data(), k, back.data());
    for (int64_t i = 0; i < k; ++i) {
      const uint8_t* blk = q4.data() + (i / 32) * 18;
      const float d = ScaleOf(blk);
      const int j = static_cast<int>(i % 32);
      const int code = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
      const double top = 8.0 / (1.0 - 0x1p-11) - 7.0;
      const double step = std::fabs(d) * (code == 15 ? top : 0.5);
      ASSERT_LE(std::fabs(x[i] - back[i]), step + 0x1p-22 * std::fabs(x[i]))
          << "Q4_0 sigma " << sigma << " i " << i << " code " << code;
    }
  }
}

TEST(QuantFormat, ExactlyRepresentableValuesStayExact) {
  std::mt19937 rng(testing::TestSeed());
  std::uniform_int_distribution<int> q8code(-127, 127), q4code(-8, 7), expo(-12, 6);
  for (int trial = 0; trial < 200; ++trial) {
    // d: a random fp16 value (normal range), either sign for Q4_0.
    const float d = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, expo(rng));
    std::vector<float> x(64), back(64);
    for (float& v : x) v = d * static_cast<float>(q8code(rng));
    x[3] = 127.0f * d;  // the block maximum fixes d = max / 127 exactly
    x[40] = -127.0f * d;
    uint8_t q8[68];
    kernels::QuantizeRowQ8_0(x.data(), 64, q8);
    kernels::DequantizeRowQ8_0(q8, 64, back.data());
    ASSERT_EQ(x, back) << "Q8_0 d " << d;

    const float sd = trial % 2 ? d : -d;
    for (float& v : x) v = sd * static_cast<float>(q4code(rng));
    x[7] = -8.0f * sd;  // the signed extreme fixes d = m / -8 exactly
    x[33] = -8.0f * sd;
    uint8_t q4[36];
    kernels::QuantizeRowQ4_0(x.data(), 64, q4);
    kernels::DequantizeRowQ4_0(q4, 64, back.data());
    ASSERT_EQ(x, back) << "Q4_0 d " << sd;
  }
  // An all-zero block: scale 0, every weight 0.
  std::vector<float> zero(32, 0.0f), back(32, 1.0f);
  uint8_t q8[34], q4[18];
  kernels::QuantizeRowQ8_0(zero.data(), 32, q8);
  kernels::DequantizeRowQ8_0(q8, 32, back.data());
  EXPECT_EQ(zero, back);
  EXPECT_EQ(ScaleOf(q8), 0.0f);
  kernels::QuantizeRowQ4_0(zero.data(), 32, q4);
  kernels::DequantizeRowQ4_0(q4, 32, back.data());
  EXPECT_EQ(zero, back);
}

TEST(QuantFormat, NonFiniteInputsDoNotCrash) {
  // Garbage in, garbage out, but defined: no UB for the sanitizers to find.
  std::vector<float> x(32, 1.0f);
  x[0] = NAN;
  x[1] = INFINITY;
  uint8_t q8[34], q4[18];
  kernels::QuantizeRowQ8_0(x.data(), 32, q8);
  kernels::QuantizeRowQ4_0(x.data(), 32, q4);
  SUCCEED();
}

TEST(QuantFormat, RowToF32DequantizesAnyRange) {
  std::mt19937 rng(testing::TestSeed());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t rows = 3, k = 96;
  std::vector<float> x(rows * k);
  for (float& v : x) v = dist(rng);
  for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> bytes(DTypeRowBytes(dt, k) * rows);
    std::vector<float> all(rows * k);
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = bytes.data() + r * DTypeRowBytes(dt, k);
      if (dt == DType::kQ8_0) {
        kernels::QuantizeRowQ8_0(x.data() + r * k, k, row);
        kernels::DequantizeRowQ8_0(row, k, all.data() + r * k);
      } else {
        kernels::QuantizeRowQ4_0(x.data() + r * k, k, row);
        kernels::DequantizeRowQ4_0(row, k, all.data() + r * k);
      }
    }
    TensorView view{dt, {rows, k}, bytes.data(), bytes.size()};
    for (auto [offset, n] : {std::pair<int64_t, int64_t>{0, 288}, {96, 96}, {5, 70}, {200, 1}}) {
      std::vector<float> out(static_cast<size_t>(n));
      kernels::RowToF32(view, offset, n, out.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], all[offset + i]) << offset << "+" << i;
    }
  }
}

}  // namespace
}  // namespace moetier
