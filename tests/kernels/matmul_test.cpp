// CPU kernels against scalar double-precision references on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "support/seed.h"

namespace moetier {
namespace {

struct RandomMatrix {
  std::vector<uint16_t> half;  // bf16 or f16 storage
  std::vector<float> f32;      // f32 storage, or the exact values the half storage holds
  TensorView view;
};

RandomMatrix MakeMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  RandomMatrix m;
  const size_t n = static_cast<size_t>(rows * cols);
  m.f32.resize(n);
  if (dtype != DType::kF32) m.half.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kBF16) {
      m.half[i] = F32ToBf16(v);
      m.f32[i] = Bf16ToF32(m.half[i]);
    } else if (dtype == DType::kF16) {
      m.half[i] = F32ToF16(v);
      m.f32[i] = F16ToF32(m.half[i]);
    } else {
      m.f32[i] = v;
    }
  }
  m.view.dtype = dtype;
  m.view.shape = {rows, cols};
  m.view.data = dtype == DType::kF32 ? static_cast<const void*>(m.f32.data()) : m.half.data();
  m.view.n_bytes = n * DTypeSize(dtype);
  return m;
}

class MatMulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatMulTest, MatchesDoubleReference) {
  std::mt19937 rng(testing::TestSeed());
  ThreadPool pool(3);
  for (auto [rows, cols, tokens] :
       {std::tuple{1, 1, 1}, {7, 33, 1}, {64, 100, 5}, {129, 1024, 3}}) {
    RandomMatrix w = MakeMatrix(GetParam(), rows, cols, rng);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(tokens * cols));
    for (float& v : x) v = dist(rng);
    std::vector<float> y(static_cast<size_t>(tokens * rows), NAN);
    kernels::MatMul(pool, x.data(), tokens, w.view, y.data());
    for (int t = 0; t < tokens; ++t) {
      for (int r = 0; r < rows; ++r) {
        double ref = 0.0, mag = 0.0;
        for (int k = 0; k < cols; ++k) {
          const double p = static_cast<double>(x[static_cast<size_t>(t * cols + k)]) *
                           w.f32[static_cast<size_t>(r * cols + k)];
          ref += p;
          mag += std::fabs(p);
        }
        // float32 accumulation of `cols` products: error bounded by ~cols·ε·Σ|products|; we
        // ask for far less, a few ulps of the magnitude sum. The avx512bf16 level rounds the
        // activations of bf16 products to bf16 (vdpbf16ps; matmul.h): 2^-8 of each product.
        const bool bf16_acts =
            kernels::ActiveCpuIsa() == kernels::CpuIsa::kAvx512Bf16 && GetParam() == DType::kBF16;
        const double tol = (bf16_acts ? 0x1p-8 : 1e-6) * mag + 1e-7;
        EXPECT_NEAR(y[static_cast<size_t>(t * rows + r)], ref, tol)
            << "rows " << rows << " cols " << cols << " t " << t << " r " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatMulTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(Kernels, RowToF32ConvertsEveryHalfExactly) {
  // All 65536 f16 and bf16 bit patterns against the scalar conversions.
  std::vector<uint16_t> bits(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i);
  for (DType d : {DType::kF16, DType::kBF16}) {
    TensorView v{d, {65536}, bits.data(), bits.size() * 2};
    std::vector<float> out(65536);
    kernels::RowToF32(v, 0, 65536, out.data());
    for (size_t i = 0; i < bits.size(); ++i) {
      const float want = d == DType::kF16 ? F16ToF32(bits[i]) : Bf16ToF32(bits[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(out[i]));
      } else {
        EXPECT_EQ(out[i], want) << i;
      }
    }
  }
}

TEST(Kernels, F16ConversionRoundTripsAndKnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite non-negative half round-trips
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << h;
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.5f)), 1.5f);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // a tie rounds to even
}

TEST(Kernels, RmsNormSoftmaxSiluAgainstDouble) {
  std::mt19937 rng(testing::TestSeed());
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int n = 257;
  std::vector<float> x(n), w(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = dist(rng);
    w[i] = dist(rng);
  }
  kernels::RmsNormRow(x.data(), w.data(), 1e-6f, n, y.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-5 * std::fabs(x[i] * inv * w[i]) + 1e-6);

  std::vector<float> s = x;
  kernels::SoftmaxRow(s.data(), n);
  double m = *std::max_element(x.begin(), x.end()), z = 0;
  for (float v : x) z += std::exp(v - m);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(s[i], std::exp(x[i] - m) / z, 1e-6);

  std::vector<float> g = x, u = w;
  kernels::SiluMul(g.data(), u.data(), n);
  for (int i = 0; i < n; ++i) {
    const double want = x[i] / (1.0 + std::exp(-static_cast<double>(x[i]))) * w[i];
    EXPECT_NEAR(g[i], want, 1e-5 * std::fabs(want) + 1e-6);
  }
}

TEST(ThreadPool, EveryIndexRunsExactlyOnceOnAllThreads) {
  ThreadPool pool(4);
  for (size_t n : {1u, 3u, 4u, 5u, 1000u}) {
    std::vector<int> hits(n, 0);
    std::vector<int> used(4, 0);
    pool.ParallelFor(n, [&](size_t b, size_t e, int t) {
      used[static_cast<size_t>(t)] = 1;
      for (size_t i = b; i < e; ++i) ++hits[i];
    });
    for (int h : hits) ASSERT_EQ(h, 1);
    EXPECT_EQ(std::accumulate(used.begin(), used.end(), 0),
              static_cast<int>(std::min<size_t>(n, 4)));
  }
}

}  // namespace
}  // namespace moetier
