// CUDA element-wise kernels (kernels/cuda/elementwise.h) against their CPU references
// (kernels/cpu/elementwise.h, RowToF32 for the embedding) on fresh random inputs.
#include "kernels/cuda/elementwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/device_buffer.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier::cuda {
namespace {

using moetier::testing::Upload;

using moetier::testing::Download;

std::vector<float> RandomFloats(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A [rows, cols] table of `dtype` holding random values; bytes as the CPU stores them.
std::vector<uint8_t> MakeTable(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  const std::vector<float> f = RandomFloats(static_cast<size_t>(rows * cols), 1.0f, rng);
  const size_t row_bytes = DTypeRowBytes(dtype, cols);
  std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = f.data() + r * cols;
    uint8_t* dst = bytes.data() + static_cast<size_t>(r) * row_bytes;
    for (int64_t c = 0; c < cols; ++c) {
      if (dtype == DType::kF32) {
        std::memcpy(dst + 4 * c, &src[c], 4);
      } else if (dtype == DType::kF16 || dtype == DType::kBF16) {
        const uint16_t h = dtype == DType::kF16 ? F32ToF16(src[c]) : F32ToBf16(src[c]);
        std::memcpy(dst + 2 * c, &h, 2);
      }
    }
    if (dtype == DType::kQ8_0) kernels::QuantizeRowQ8_0(src, cols, dst);
    if (dtype == DType::kQ4_0) kernels::QuantizeRowQ4_0(src, cols, dst);
  }
  return bytes;
}

class EmbedTest : public ::testing::TestWithParam<DType> {};

TEST_P(EmbedTest, MatchesRowToF32Exactly) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const DType dtype = GetParam();
  for (auto [rows, cols, n_tokens] : {std::tuple{1, 32, 1}, {37, 96, 13}, {300, 2048, 64}}) {
    const std::vector<uint8_t> table = MakeTable(dtype, rows, cols, rng);
    std::uniform_int_distribution<int32_t> pick(0, rows - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
    for (int32_t& t : tokens) t = pick(rng);
    tokens.back() = rows - 1;  // the last row too

    const DeviceBuffer<uint8_t> d_table = Upload(table);
    const DeviceBuffer<int32_t> d_tokens = Upload(tokens);
    DeviceBuffer<float> d_h =
        DeviceBuffer<float>::Create(static_cast<size_t>(n_tokens * cols), "h").value();
    const DeviceMatrix m{dtype, rows, cols, d_table.data()};
    LaunchEmbed(m, d_tokens.data(), n_tokens, d_h.data(), nullptr);
    const std::vector<float> h = Download(d_h, static_cast<size_t>(n_tokens * cols));

    const TensorView view{dtype, {rows, cols}, table.data(), table.size()};
    std::vector<float> ref(static_cast<size_t>(cols));
    for (int t = 0; t < n_tokens; ++t) {
      kernels::RowToF32(view, static_cast<int64_t>(tokens[static_cast<size_t>(t)]) * cols, cols,
                        ref.data());
      // Every format decodes to values exact in float32 (fp16 scale x small integer): equal.
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(h[static_cast<size_t>(t * cols + c)], ref[static_cast<size_t>(c)])
            << DTypeName(dtype) << " rows " << rows << " cols " << cols << " t " << t << " c " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTableDtypes, EmbedTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                           DType::kQ4_0),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(CudaRmsNormTest, MatchesRmsNormRow) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const float eps = 1e-6f;
  for (auto [d, n_src, with_rows] : {std::tuple{1, 1, false},
                                     {7, 3, true},
                                     {2048, 5, false},
                                     {4099, 9, true},
                                     {8192, 64, false}}) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n_src * d), 3.0f, rng);
    const std::vector<float> weight = RandomFloats(static_cast<size_t>(d), 1.0f, rng);
    std::vector<int32_t> rows;
    if (with_rows)  // every other source row, backwards
      for (int r = n_src - 1; r >= 0; r -= 2) rows.push_back(r);
    const int64_t n_rows = with_rows ? static_cast<int64_t>(rows.size()) : n_src;

    const DeviceBuffer<float> d_x = Upload(x);
    const DeviceBuffer<float> d_w = Upload(weight);
    const DeviceBuffer<int32_t> d_rows = Upload(rows);
    DeviceBuffer<float> d_y =
        DeviceBuffer<float>::Create(static_cast<size_t>(n_rows * d), "y").value();
    LaunchRmsNorm(d_x.data(), with_rows ? d_rows.data() : nullptr, n_rows, d_w.data(), eps, d,
                  d_y.data(), nullptr);
    const std::vector<float> y = Download(d_y, static_cast<size_t>(n_rows * d));

    std::vector<float> ref(static_cast<size_t>(d));
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t r = with_rows ? rows[static_cast<size_t>(i)] : i;
      kernels::RmsNormRow(x.data() + r * d, weight.data(), eps, d, ref.data());
      for (int64_t c = 0; c < d; ++c) {
        // Both sum the squares in double (in another order) and round the scale to float, so
        // the scales agree to 1 ulp; y = x * scale * w then differs by at most ~2 ulp.
        const float want = ref[static_cast<size_t>(c)];
        ASSERT_NEAR(y[static_cast<size_t>(i * d + c)], want, 1e-6f * std::fabs(want) + 1e-30f)
            << "d " << d << " row " << i << " c " << c;
      }
    }
  }
}

// An add-and-norm check's device inputs: x, the weights, and h twice with a y for each (two
// launches compared).
struct AddNormBuffers {
  DeviceBuffer<float> x, w, h_a, h_b, y_a, y_b;
};
AddNormBuffers UploadAddNorm(const std::vector<float>& x, const std::vector<float>& h,
                             const std::vector<float>& weight) {
  return {Upload(x),
          Upload(weight),
          Upload(h),
          Upload(h),
          DeviceBuffer<float>::Create(x.size(), "y").value(),
          DeviceBuffer<float>::Create(x.size(), "y").value()};
}

// The fused residual add and norm: the bits of the add and then the norm, in registers (d up to
// 4096) and past them.
TEST(CudaAddRmsNormTest, EqualsTheAddThenTheNorm) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const float eps = 1e-6f;
  for (auto [d, n_rows] : {std::pair{7, 3}, {2048, 1}, {2048, 5}, {4099, 4}}) {
    const auto n = static_cast<size_t>(n_rows * d);
    const std::vector<float> x = RandomFloats(n, 1.0f, rng);
    const std::vector<float> h = RandomFloats(n, 3.0f, rng);
    const std::vector<float> weight = RandomFloats(static_cast<size_t>(d), 1.0f, rng);
    AddNormBuffers b = UploadAddNorm(x, h, weight);  // a: fused, b: apart
    LaunchAddRmsNorm(b.x.data(), n_rows, b.h_a.data(), b.w.data(), eps, d, b.y_a.data(), nullptr);
    LaunchAdd(b.x.data(), static_cast<int64_t>(n), b.h_b.data(), nullptr);
    LaunchRmsNorm(b.h_b.data(), nullptr, n_rows, b.w.data(), eps, d, b.y_b.data(), nullptr);
    EXPECT_EQ(Download(b.h_a, n), Download(b.h_b, n)) << "d " << d;
    EXPECT_EQ(Download(b.y_a, n), Download(b.y_b, n)) << "d " << d;
    std::vector<float> sum = h;
    kernels::Axpy(1.0f, x.data(), static_cast<int64_t>(n), sum.data());
    EXPECT_EQ(Download(b.h_a, n), sum) << "d " << d;
  }
}

// The scan of the sums inside the fused add and norm: the first non-finite index of h + x as
// kernels::FirstNonFinite finds it (none when clean), the sums and y as without the scan (the
// bits, NaN included); and y's rows quantized beside it as the CPU quantizes activations, where
// NormQuantizes (rows of whole 32-blocks held in registers; 4099 takes the long-row path, unscanned
// by the quantizer and scanned by the loop).
TEST(CudaAddRmsNormTest, ScansTheSumsAndQuantizesTheOutput) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr unsigned long long kNone = ~0ull >> 1;
  const float eps = 1e-6f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (auto [d, n_rows] :
       {std::pair{2048, 1}, {2048, 5}, {2080, 2}, {4096, 3}, {4099, 2}, {96, 7}}) {
    const auto n = static_cast<size_t>(n_rows * d);
    std::uniform_int_distribution<size_t> at(0, n - 1);
    for (int bad = 0; bad < 3; ++bad) {  // clean; one inf; a NaN and an inf
      std::vector<float> x = RandomFloats(n, 1.0f, rng);
      const std::vector<float> h = RandomFloats(n, 3.0f, rng);
      if (bad >= 1) x[at(rng)] = inf;
      if (bad >= 2) x[at(rng)] = nan;
      const std::vector<float> weight = RandomFloats(static_cast<size_t>(d), 1.0f, rng);
      AddNormBuffers b = UploadAddNorm(x, h, weight);  // a: scanned and quantized, b: plain
      DeviceBuffer<int8_t> q = DeviceBuffer<int8_t>::Create(n, "q").value();
      DeviceBuffer<float> qd = DeviceBuffer<float>::Create(n / 32 + 1, "q scales").value();
      DeviceBuffer<unsigned long long> first = Upload(std::vector<unsigned long long>{kNone});
      LaunchAddRmsNorm(b.x.data(), n_rows, b.h_a.data(), b.w.data(), eps, d, b.y_a.data(), nullptr,
                       first.data(), QuantizedActs{q.data(), qd.data()});
      LaunchAddRmsNorm(b.x.data(), n_rows, b.h_b.data(), b.w.data(), eps, d, b.y_b.data(), nullptr);
      const std::vector<float> sums = Download(b.h_a, n), y = Download(b.y_a, n);
      const std::vector<float> sums_plain = Download(b.h_b, n), y_plain = Download(b.y_b, n);
      EXPECT_EQ(std::memcmp(sums.data(), sums_plain.data(), n * 4), 0) << "d " << d;
      EXPECT_EQ(std::memcmp(y.data(), y_plain.data(), n * 4), 0) << "d " << d;
      std::vector<float> sum = h;
      kernels::Axpy(1.0f, x.data(), static_cast<int64_t>(n), sum.data());
      const int64_t want = kernels::FirstNonFinite(sum.data(), static_cast<int64_t>(n));
      const unsigned long long got = Download(first, 1)[0];
      EXPECT_EQ(got, want < 0 ? kNone : static_cast<unsigned long long>(want))
          << "d " << d << " rows " << n_rows << " bad " << bad;
      if (bad > 0 || !NormQuantizes(d)) continue;  // non-finite rows' codes are unspecified
      const testing::HostQuantized ref = testing::QuantizeActivations(y);
      EXPECT_EQ(Download(q, n), ref.q) << "d " << d << " rows " << n_rows;
      EXPECT_EQ(Download(qd, n / 32), ref.d) << "d " << d << " rows " << n_rows;
    }
  }
  EXPECT_TRUE(NormQuantizes(2048));
  EXPECT_FALSE(NormQuantizes(4099));  // not whole 32-blocks
  EXPECT_FALSE(NormQuantizes(8192));  // past the registers
}

// The norm of picked rows (the logits') quantizes its output rows as the CPU would.
TEST(CudaRmsNormTest, QuantizesPickedRows) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const int64_t d = 2048, n_src = 9;
  const std::vector<int32_t> rows = {8, 3, 0};
  const auto n_rows = static_cast<int64_t>(rows.size());
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n_src * d), 2.0f, rng);
  const std::vector<float> weight = RandomFloats(static_cast<size_t>(d), 1.0f, rng);
  const DeviceBuffer<float> d_x = Upload(x);
  const DeviceBuffer<float> d_w = Upload(weight);
  const DeviceBuffer<int32_t> d_rows = Upload(rows);
  const auto n = static_cast<size_t>(n_rows * d);
  DeviceBuffer<float> d_y = DeviceBuffer<float>::Create(n, "y").value();
  DeviceBuffer<int8_t> q = DeviceBuffer<int8_t>::Create(n, "q").value();
  DeviceBuffer<float> qd = DeviceBuffer<float>::Create(n / 32, "q scales").value();
  LaunchRmsNorm(d_x.data(), d_rows.data(), n_rows, d_w.data(), 1e-6f, d, d_y.data(), nullptr,
                QuantizedActs{q.data(), qd.data()});
  const testing::HostQuantized ref = testing::QuantizeActivations(Download(d_y, n));
  EXPECT_EQ(Download(q, n), ref.q);
  EXPECT_EQ(Download(qd, n / 32), ref.d);
}

TEST(CudaAddTest, MatchesAxpyOfOneExactly) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{(1 << 22) + 3}}) {
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n), 1.0f, rng);
    std::vector<float> y = RandomFloats(static_cast<size_t>(n), 1.0f, rng);
    const DeviceBuffer<float> d_x = Upload(x);
    DeviceBuffer<float> d_y = Upload(y);
    LaunchAdd(d_x.data(), n, d_y.data(), nullptr);
    const std::vector<float> got = Download(d_y, static_cast<size_t>(n));
    kernels::Axpy(1.0f, x.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i)  // one float addition (1 * x is exact): equal
      ASSERT_EQ(got[static_cast<size_t>(i)], y[static_cast<size_t>(i)]) << "n " << n << " i " << i;
  }
}

TEST(CudaSiluMulTest, MatchesSiluMul) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int64_t n : {int64_t{1}, int64_t{777}, int64_t{(1 << 20) + 1}}) {
    std::vector<float> gate = RandomFloats(static_cast<size_t>(n), 4.0f, rng);
    const std::vector<float> up = RandomFloats(static_cast<size_t>(n), 1.0f, rng);
    if (n > 4) {  // the tails: e^-g overflows, or vanishes next to 1
      gate[0] = -100.0f;
      gate[1] = 100.0f;
      gate[2] = 0.0f;
    }
    DeviceBuffer<float> d_gate = Upload(gate);
    const DeviceBuffer<float> d_up = Upload(up);
    LaunchSiluMul(d_gate.data(), d_up.data(), n, nullptr);
    const std::vector<float> got = Download(d_gate, static_cast<size_t>(n));
    kernels::SiluMul(gate.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // The same formula; CUDA's expf is within 2 ulp of the CPU's exp, and the division and
      // product add an ulp each: a few ulp of the result.
      const float want = gate[static_cast<size_t>(i)];
      ASSERT_NEAR(got[static_cast<size_t>(i)], want, 1e-6f * std::fabs(want) + 1e-37f)
          << "n " << n << " i " << i;
    }
  }
}

TEST(CudaFirstNonFiniteTest, FindsTheFirstAsTheCpuDoes) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr unsigned long long kNone = ~0ull >> 1;
  const int64_t n = (1 << 21) + 5;
  std::uniform_int_distribution<int64_t> at(0, n - 1);
  struct Case {
    std::vector<std::pair<int64_t, float>> bad;  // positions and values
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<Case> cases = {
      {{}},                                                 // clean
      {{{0, nan}}},                                         // first element
      {{{n - 1, -inf}}},                                    // last element
      {{{at(rng), inf}, {at(rng), nan}, {at(rng), -inf}}},  // several, random places
      {{{n / 2, nan}, {n / 2 + 1, inf}, {n / 2 - 300, inf}}},
  };
  for (const Case& c : cases) {
    std::vector<float> x = RandomFloats(static_cast<size_t>(n), 1e30f, rng);  // large, finite
    for (auto [i, v] : c.bad) x[static_cast<size_t>(i)] = v;
    const DeviceBuffer<float> d_x = Upload(x);
    DeviceBuffer<unsigned long long> d_first = Upload(std::vector<unsigned long long>{kNone});
    LaunchFirstNonFinite(d_x.data(), n, d_first.data(), nullptr);
    const unsigned long long got = Download(d_first, 1)[0];
    const int64_t want = kernels::FirstNonFinite(x.data(), n);
    if (want < 0) {
      EXPECT_EQ(got, kNone) << "clean input";
    } else {
      EXPECT_EQ(got, static_cast<unsigned long long>(want));
    }
  }
}

// Each row's arg-max is kernels::ArgMax's pick, on rows with many exact ties (values from a
// small set, so the lowest index among equal maxima decides), at lengths from one element to a
// real vocabulary (split over many blocks a row), one to sixteen rows; a row of equal values
// gives index 0. A non-finite element is reported as LaunchFirstNonFinite does (its index in x)
// and never wins its row.
TEST(CudaArgMaxRowsTest, PicksAsTheCpuAndFindsNonFinite) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  constexpr unsigned long long kNone = ~0ull >> 1;
  std::uniform_int_distribution<int> small(-20, 20);
  for (int64_t n : {int64_t{1}, int64_t{33}, int64_t{8195}, int64_t{151936}}) {
    for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{16}}) {
      std::vector<float> x(static_cast<size_t>(n * rows));
      for (float& v : x) v = static_cast<float>(small(rng)) * 0.25f;
      if (rows > 1) std::fill(x.begin() + n, x.begin() + 2 * n, 1.5f);  // row 1: all equal
      for (bool poison : {false, true}) {
        std::vector<float> y = x;
        if (poison) {  // a NaN at the front of the last row, an infinity above every value
          y[static_cast<size_t>((rows - 1) * n)] = std::numeric_limits<float>::quiet_NaN();
          y[static_cast<size_t>(rows * n - 1)] = std::numeric_limits<float>::infinity();
        }
        const DeviceBuffer<float> d_x = Upload(y);
        DeviceBuffer<unsigned long long> d_keys =
            DeviceBuffer<unsigned long long>::Create(static_cast<size_t>(rows), "keys").value();
        DeviceBuffer<unsigned long long> d_first = Upload(std::vector<unsigned long long>{kNone});
        LaunchArgMaxRows(d_x.data(), rows, n, d_keys.data(), d_first.data(), nullptr);
        const std::vector<unsigned long long> keys = Download(d_keys, static_cast<size_t>(rows));
        const std::string where = "n " + std::to_string(n) + " rows " + std::to_string(rows) +
                                  (poison ? " poisoned" : "");
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> row(y.begin() + r * n, y.begin() + (r + 1) * n);
          for (float& v : row) v = std::isfinite(v) ? v : -1e30f;  // never wins
          const int64_t want = kernels::ArgMax(row.data(), n);
          EXPECT_EQ(ArgMaxKeyIndex(keys[static_cast<size_t>(r)]), want) << where << " row " << r;
        }
        const int64_t bad = kernels::FirstNonFinite(y.data(), n * rows);
        EXPECT_EQ(Download(d_first, 1)[0], bad < 0 ? kNone : static_cast<unsigned long long>(bad))
            << where;
      }
    }
  }
}

TEST(CudaElementwiseTest, EmptyInputsLaunchNothing) {
  MT_REQUIRE_GPU();
  LaunchAdd(nullptr, 0, nullptr, nullptr);
  LaunchSiluMul(nullptr, nullptr, 0, nullptr);
  LaunchFirstNonFinite(nullptr, 0, nullptr, nullptr);
  LaunchRmsNorm(nullptr, nullptr, 0, nullptr, 1e-6f, 64, nullptr, nullptr);
  LaunchEmbed(DeviceMatrix{DType::kF32, 4, 64, nullptr}, nullptr, 0, nullptr, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace moetier::cuda
