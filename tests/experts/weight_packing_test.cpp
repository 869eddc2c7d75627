// --weight-packing: the flag's parsing, and the heuristic that picks the dtype a bf16 matrix is
// held in for the CPU (BF16C where its rows fit and, under auto, packing saves at least
// kMinPackingSaving of the bytes), per matrix and per expert layout.
#include "experts/weight_packing.h"

#include <gtest/gtest.h>

namespace moetier {
namespace {

constexpr WeightPacking kModes[] = {WeightPacking::kAuto, WeightPacking::kNone,
                                    WeightPacking::kBf16c};

// What auto should do, from the byte counts alone (independently of CpuMatrixDType).
bool AutoShouldPack(int64_t k) {
  if (k <= 0 || k % 32 != 0 || k > kBf16cMaxRowElements) return false;
  const double packed = static_cast<double>(DTypeRowBytes(DType::kBF16C, k));
  const double stored = static_cast<double>(DTypeRowBytes(DType::kBF16, k));
  return stored - packed >= kMinPackingSaving * stored;
}

TEST(WeightPacking, ParsesTheThreeNamesAndNamesTheFlagOtherwise) {
  for (WeightPacking p : kModes) {
    auto got = ParseWeightPacking(std::string(WeightPackingName(p)));
    ASSERT_TRUE(got.ok()) << WeightPackingName(p) << ": " << got.message();
    EXPECT_EQ(*got, p);
  }
  EXPECT_EQ(*ParseWeightPacking("auto"), WeightPacking::kAuto);
  EXPECT_EQ(*ParseWeightPacking("none"), WeightPacking::kNone);
  EXPECT_EQ(*ParseWeightPacking("bf16c"), WeightPacking::kBf16c);
  for (const char* bad : {"", "BF16C", "bf16", "off", "q8_0", " auto", "auto "}) {
    auto got = ParseWeightPacking(bad);
    ASSERT_FALSE(got.ok()) << "'" << bad << "'";
    EXPECT_NE(got.message().find("--weight-packing"), std::string::npos) << got.message();
    std::string quoted(1, '\'');
    quoted += bad;
    quoted += '\'';
    EXPECT_NE(got.message().find(quoted), std::string::npos) << got.message();
  }
}

TEST(WeightPacking, TheByteCountsThatDecideAuto) {
  // The formula the heuristic rests on: a 64-byte header and 48 bytes per 32 weights.
  EXPECT_EQ(DTypeRowBytes(DType::kBF16C, 32), 64u + 48u);
  EXPECT_EQ(DTypeRowBytes(DType::kBF16C, 2048), 64u + 64u * 48u);
  EXPECT_EQ(DTypeRowBytes(DType::kBF16, 2048), 4096u);
  // Rows of 128 weights are no smaller, 192 save 8.3 %, 224 save 10.7 %.
  EXPECT_EQ(DTypeRowBytes(DType::kBF16C, 128), DTypeRowBytes(DType::kBF16, 128));
  EXPECT_FALSE(AutoShouldPack(192));
  EXPECT_TRUE(AutoShouldPack(224));
}

TEST(WeightPacking, AutoPacksBf16RowsExactlyWhereTheBytesSayItPays) {
  int64_t first_packed = -1;
  for (int64_t k = 32; k <= 8192; k += 32) {
    const DType got = CpuMatrixDType(DType::kBF16, k, WeightPacking::kAuto);
    EXPECT_EQ(got, AutoShouldPack(k) ? DType::kBF16C : DType::kBF16) << "k=" << k;
    if (got == DType::kBF16C && first_packed < 0) first_packed = k;
  }
  EXPECT_EQ(first_packed, 224);
  // The cases named in the design: 128 and 192 stay, 224 and real MoE rows pack.
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 128, WeightPacking::kAuto), DType::kBF16);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 192, WeightPacking::kAuto), DType::kBF16);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 224, WeightPacking::kAuto), DType::kBF16C);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 768, WeightPacking::kAuto), DType::kBF16C);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 2048, WeightPacking::kAuto), DType::kBF16C);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, kBf16cMaxRowElements, WeightPacking::kAuto),
            DType::kBF16C);
}

TEST(WeightPacking, RowsBf16cCannotHoldStayUnderEveryMode) {
  const int64_t too_long = kBf16cMaxRowElements + 32;  // whole blocks, but too long
  ASSERT_EQ(too_long % 32, 0);
  for (WeightPacking p : kModes) {
    SCOPED_TRACE(WeightPackingName(p));
    for (int64_t k : {int64_t{33}, int64_t{48}, int64_t{2047}, too_long, int64_t{1} << 20})
      EXPECT_EQ(CpuMatrixDType(DType::kBF16, k, p), DType::kBF16) << "k=" << k;
  }
}

TEST(WeightPacking, OnlyBf16Packs) {
  for (WeightPacking p : kModes) {
    SCOPED_TRACE(WeightPackingName(p));
    for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kF32, DType::kF16, DType::kBF16C})
      for (int64_t k : {int64_t{64}, int64_t{2048}, int64_t{7168}})
        EXPECT_EQ(CpuMatrixDType(t, k, p), t) << DTypeName(t) << " k=" << k;
  }
}

TEST(WeightPacking, Bf16cPacksEveryRowItShrinksAndNoneNothing) {
  // bf16c packs a matrix as `convert --dense-dtype bf16c` does: whenever the row gets smaller.
  for (int64_t k = 32; k <= 4096; k += 32) {
    const bool shrinks = DTypeRowBytes(DType::kBF16C, k) < DTypeRowBytes(DType::kBF16, k);
    EXPECT_EQ(CpuMatrixDType(DType::kBF16, k, WeightPacking::kBf16c),
              shrinks ? DType::kBF16C : DType::kBF16)
        << k;
    EXPECT_EQ(CpuMatrixDType(DType::kBF16, k, WeightPacking::kNone), DType::kBF16) << k;
  }
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 128, WeightPacking::kBf16c), DType::kBF16);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 160, WeightPacking::kBf16c), DType::kBF16C);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, 160, WeightPacking::kAuto), DType::kBF16);
  EXPECT_EQ(CpuMatrixDType(DType::kBF16, kBf16cMaxRowElements, WeightPacking::kNone), DType::kBF16);
}

TEST(WeightPacking, ExpertsOfARealModelPackUnderAuto) {
  const ExpertLayout real{2048, 768, DType::kBF16};
  auto a = CpuExpertDType(real, WeightPacking::kAuto);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(*a, DType::kBF16C);
  // ...and the bank they make is at least kMinPackingSaving smaller.
  const ExpertLayout packed{2048, 768, *a};
  EXPECT_LE(static_cast<double>(packed.bank_bytes(128)),
            (1.0 - kMinPackingSaving) * static_cast<double>(real.bank_bytes(128)));
  auto b = CpuExpertDType(real, WeightPacking::kBf16c);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(*b, DType::kBF16C);
  auto n = CpuExpertDType(real, WeightPacking::kNone);
  ASSERT_TRUE(n.ok()) << n.message();
  EXPECT_EQ(*n, DType::kBF16);
}

TEST(WeightPacking, FixtureSizedExpertsPackOnlyWhenAsked) {
  const ExpertLayout tiny{64, 32, DType::kBF16};
  auto a = CpuExpertDType(tiny, WeightPacking::kAuto);
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(*a, DType::kBF16);
  auto b = CpuExpertDType(tiny, WeightPacking::kBf16c);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(*b, DType::kBF16C);
}

TEST(WeightPacking, BothRowLengthsMustPay) {
  // Gate/up rows of 2048 would pay, down rows of 128 would not: auto leaves the layer as stored
  // rather than hold half of it packed; bf16c packs both.
  const ExpertLayout mixed{2048, 128, DType::kBF16};
  ASSERT_EQ(CpuMatrixDType(DType::kBF16, 2048, WeightPacking::kAuto), DType::kBF16C);
  EXPECT_EQ(*CpuExpertDType(mixed, WeightPacking::kAuto), DType::kBF16);
  EXPECT_EQ(*CpuExpertDType(ExpertLayout{128, 2048, DType::kBF16}, WeightPacking::kAuto),
            DType::kBF16);
  EXPECT_EQ(*CpuExpertDType(mixed, WeightPacking::kBf16c), DType::kBF16C);
}

TEST(WeightPacking, Bf16cOnExpertsThatCannotPackIsAnErrorNamingTheFlag) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kF32}) {
    const ExpertLayout lay{2048, 768, t};
    auto got = CpuExpertDType(lay, WeightPacking::kBf16c);
    ASSERT_FALSE(got.ok()) << DTypeName(t);
    EXPECT_NE(got.message().find("--weight-packing"), std::string::npos) << got.message();
    EXPECT_NE(got.message().find(std::string(DTypeName(t))), std::string::npos) << got.message();
    // auto and none hold them as stored.
    EXPECT_EQ(*CpuExpertDType(lay, WeightPacking::kAuto), t);
    EXPECT_EQ(*CpuExpertDType(lay, WeightPacking::kNone), t);
  }
  // bf16 rows that are not whole 32-blocks.
  auto odd = CpuExpertDType(ExpertLayout{2048, 33, DType::kBF16}, WeightPacking::kBf16c);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.message().find("--weight-packing"), std::string::npos) << odd.message();
  EXPECT_NE(odd.message().find("33"), std::string::npos) << odd.message();
  EXPECT_EQ(*CpuExpertDType(ExpertLayout{2048, 33, DType::kBF16}, WeightPacking::kAuto),
            DType::kBF16);
  // Experts stored packed already stay so under every mode.
  for (WeightPacking p : kModes) {
    auto c = CpuExpertDType(ExpertLayout{2048, 768, DType::kBF16C}, p);
    ASSERT_TRUE(c.ok()) << c.message();
    EXPECT_EQ(*c, DType::kBF16C);
  }
}

}  // namespace
}  // namespace moetier
