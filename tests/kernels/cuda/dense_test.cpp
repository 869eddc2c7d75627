// DenseMatMul (kernels/cuda/dense.h) against the CPU's matrix product at its scalar level
// (kernels/cpu/matmul.h: PreparedActivations + DotRows with CpuIsa::kScalar, which quantizes the
// activations for Q8_0/Q4_0 exactly as the GPU does and sums in double) on fresh random inputs.
#include "kernels/cuda/dense.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/device_buffer.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier::cuda {
namespace {

// Up to this many tokens DenseMatMul runs its own fp32 kernels (kMaxDecodeTokens in dense.cu);
// past it, cuBLAS on bf16/f16/tf32 operands.
constexpr int64_t kDecodeTokens = 64;

using moetier::testing::Upload;

using moetier::testing::Download;

std::vector<float> RandomFloats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A random [rows, cols] weight matrix stored as `dtype`, bytes as the CPU stores them.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  TensorView view;
  std::vector<float> values;  // the stored values as float32 (RowToF32)
};

HostMatrix MakeMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  const std::vector<float> f = RandomFloats(static_cast<size_t>(rows * cols), rng);
  const size_t row_bytes = DTypeRowBytes(dtype, cols);
  HostMatrix m;
  m.bytes.resize(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = f.data() + r * cols;
    uint8_t* dst = m.bytes.data() + static_cast<size_t>(r) * row_bytes;
    if (dtype == DType::kQ8_0) {
      kernels::QuantizeRowQ8_0(src, cols, dst);
    } else if (dtype == DType::kQ4_0) {
      kernels::QuantizeRowQ4_0(src, cols, dst);
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        if (dtype == DType::kF32) {
          std::memcpy(dst + 4 * c, &src[c], 4);
        } else {
          const uint16_t h = dtype == DType::kF16 ? F32ToF16(src[c]) : F32ToBf16(src[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
      }
    }
  }
  m.view = TensorView{dtype, {rows, cols}, m.bytes.data(), m.bytes.size()};
  m.values.resize(f.size());
  kernels::RowToF32(m.view, 0, rows * cols, m.values.data());
  return m;
}

// The CPU's y [n_tokens, rows] at the scalar level (double sums; the SIMD levels only reorder
// them, except avx512bf16, which rounds bf16 products' activations and is not used here).
std::vector<float> CpuProduct(const HostMatrix& w, const std::vector<float>& x, int64_t n_tokens) {
  const int64_t rows = w.view.dim(0);
  const int64_t cols = w.view.dim(1);
  kernels::PreparedActivations prepared;
  prepared.Prepare(x.data(), n_tokens, cols, w.view.dtype, kernels::CpuIsa::kScalar,
                   kernels::PreparedActivations::Tiles::kNone);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));
  kernels::DotRows(w.view, 0, rows, prepared, y.data(), rows);
  return y;
}

struct Shape {
  int64_t rows, cols;
};

// Per element of one token's x: half the step of the int8 activations the CPU makes of it,
// amax/254 of the element's 32-wide block (the most its rounding moves it).
std::vector<double> Int8HalfSteps(const float* x, int64_t cols) {
  std::vector<double> half(static_cast<size_t>(cols));
  for (int64_t b = 0; b < cols; b += 32) {
    const int64_t end = std::min<int64_t>(cols, b + 32);
    double amax = 0.0;
    for (int64_t c = b; c < end; ++c) amax = std::max(amax, std::fabs(static_cast<double>(x[c])));
    for (int64_t c = b; c < end; ++c) half[static_cast<size_t>(c)] = amax / 254;
  }
  return half;
}

class DenseMatMulTest : public ::testing::TestWithParam<DType> {};

// Each shape's product for each token count on the device against the CPU's.
void CheckProducts(DType dtype, const std::vector<Shape>& shapes,
                   const std::vector<int64_t>& token_counts, std::mt19937& rng) {
  const bool quant = IsBlockQuantized(dtype);
  int64_t most_cols = 0, most_rows = 0, most_tokens = 0;
  for (const Shape& s : shapes) {
    most_cols = std::max(most_cols, s.cols);
    most_rows = std::max(most_rows, s.rows);
  }
  for (int64_t n : token_counts) most_tokens = std::max(most_tokens, n);
  auto mm = DenseMatMul::Create(most_tokens, most_cols, most_rows);
  ASSERT_TRUE(mm.ok()) << mm.status().message();
  for (const Shape& s : shapes) {
    const HostMatrix w = MakeMatrix(dtype, s.rows, s.cols, rng);
    const DeviceBuffer<uint8_t> d_w = Upload(w.bytes);
    const DeviceMatrix dm{dtype, s.rows, s.cols, d_w.data()};
    for (int64_t n_tokens : token_counts) {
      const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens * s.cols), rng);
      const DeviceBuffer<float> d_x = Upload(x);
      DeviceBuffer<float> d_y =
          DeviceBuffer<float>::Create(static_cast<size_t>(n_tokens * s.rows), "y").value();
      mm->Run(dm, d_x.data(), n_tokens, d_y.data(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> y = Download(d_y, static_cast<size_t>(n_tokens * s.rows));
      const std::vector<float> want = CpuProduct(w, x, n_tokens);
      // Decode: fp32 sums in another order than the CPU's double ones (and, quantized, the
      // same int8 activations and integer dots): ~1e-5 of the row's magnitude sum|w||x|.
      // Prefill (cuBLAS): activations rounded to bf16/f16/tf32 (2^-9 of each product at most):
      // 1e-2 of the magnitude covers it widely. Quantized, the CPU's activations are int8: each
      // within amax/254 of x (amax of its 32-wide block), which can make up to
      // sum|w|·amax/254 (over 1 % of the magnitude for one 32-wide block: 1.2 % was seen among
      // a million random rows), plus the GPU's bf16 roundings of w and x (2^-8 a product).
      const bool decode = n_tokens <= kDecodeTokens;
      const double rel = decode ? 1e-5 : quant ? 1.0 / 128 : 1e-2;
      for (int64_t t = 0; t < n_tokens; ++t) {
        const std::vector<double> half_step =
            quant && !decode ? Int8HalfSteps(x.data() + t * s.cols, s.cols)
                             : std::vector<double>(static_cast<size_t>(s.cols), 0.0);
        for (int64_t r = 0; r < s.rows; ++r) {
          double mag = 0.0;
          double int8_error = 0.0;
          for (int64_t c = 0; c < s.cols; ++c) {
            const double wc = w.values[static_cast<size_t>(r * s.cols + c)];
            mag += std::fabs(wc * x[static_cast<size_t>(t * s.cols + c)]);
            int8_error += std::fabs(wc) * half_step[static_cast<size_t>(c)];
          }
          const size_t i = static_cast<size_t>(t * s.rows + r);
          ASSERT_NEAR(y[i], want[i], rel * mag + int8_error + 1e-6)
              << DTypeName(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens "
              << n_tokens << " t " << t << " r " << r;
        }
      }
    }
  }
}

// cuBLAS is loaded at first use, not linked: the toolkit's library is found (no GPU needed) with
// every entry point prefill calls, and a second caller gets the same one.
TEST(CublasLibraryTest, LoadsWithEveryEntryPoint) {
  const Expected<const CublasLibrary*> lib = LoadCublas();
  ASSERT_TRUE(lib.ok()) << lib.status().message();
  const CublasLibrary& l = **lib;
  EXPECT_NE(l.create, nullptr);
  EXPECT_NE(l.destroy, nullptr);
  EXPECT_NE(l.set_stream, nullptr);
  EXPECT_NE(l.set_workspace, nullptr);
  EXPECT_NE(l.gemm_ex, nullptr);
  const Expected<const CublasLibrary*> again = LoadCublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
}

TEST_P(DenseMatMulTest, MatchesCpuMatMul) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const DType dtype = GetParam();
  const bool quant = IsBlockQuantized(dtype);
  // Rows not multiples of the 8 rows a block takes (quantized: 17000 rows, more than the fused
  // kernel's one wave of blocks takes at once; 17003 rows at 4 a warp, the last warp's 3);
  // cols: tiny, one partial staging chunk
  // (quantized: 96 = 3 blocks, 2080 = 65 blocks = one full chunk of 64 + 1), the per-element
  // path for float formats (50 and 4100: rows not 16-byte aligned), model-like widths, and
  // enough rows for the float kernels' 4-rows-a-warp (4100) and 2-rows-a-warp (2051) tilings.
  const std::vector<Shape> shapes =
      quant ? std::vector<Shape>{{1, 32},    {37, 96},   {133, 2048}, {61, 2080},
                                 {19, 4096}, {4100, 64}, {17000, 32}, {17003, 64}}
            : std::vector<Shape>{{1, 64},    {37, 48},   {13, 50},  {133, 2048},
                                 {19, 4100}, {4100, 64}, {2051, 48}};
  const std::vector<int64_t> token_counts = {1, 2, 3, 5, 16, 64, 65, 700};
  CheckProducts(dtype, shapes, token_counts, rng);
}

// Matrices long enough that a warp takes several rows (the lm_head's case), Q4_0 staging two at
// a time, with rows of two staging chunks and an odd count for the last warp.
TEST_P(DenseMatMulTest, LongMatricesMatchCpuMatMul) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  CheckProducts(GetParam(), {{8501, 2080}}, {1, 3}, rng);
}

// Prefill of a quantized matrix whose bf16 copy exceeds the 64 MB dequantization scratch: the
// rows go through cuBLAS in several chunks, each written to its own columns of y.
TEST_P(DenseMatMulTest, PrefillDequantizesInChunks) {
  MT_REQUIRE_GPU();
  if (!IsBlockQuantized(GetParam())) GTEST_SKIP() << "float formats are not dequantized";
  std::mt19937 rng(testing::TestSeed());
  const int64_t rows = 8200, cols = 4096, n_tokens = 65;  // 67 MB as bf16: two chunks
  const HostMatrix w = MakeMatrix(GetParam(), rows, cols, rng);
  const DeviceBuffer<uint8_t> d_w = Upload(w.bytes);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens * cols), rng);
  const DeviceBuffer<float> d_x = Upload(x);
  DeviceBuffer<float> d_y =
      DeviceBuffer<float>::Create(static_cast<size_t>(n_tokens * rows), "y").value();
  auto mm = DenseMatMul::Create(n_tokens, cols, rows);
  ASSERT_TRUE(mm.ok()) << mm.status().message();
  mm->Run(DeviceMatrix{GetParam(), rows, cols, d_w.data()}, d_x.data(), n_tokens, d_y.data(),
          nullptr);
  const std::vector<float> y = Download(d_y, static_cast<size_t>(n_tokens * rows));
  const std::vector<float> want = CpuProduct(w, x, n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double mag = 0.0;
      for (int64_t c = 0; c < cols; ++c)
        mag += std::fabs(static_cast<double>(w.values[static_cast<size_t>(r * cols + c)]) *
                         x[static_cast<size_t>(t * cols + c)]);
      const size_t i = static_cast<size_t>(t * rows + r);
      // As MatchesCpuMatMul's prefill tolerance: bf16 operands against int8 activations.
      ASSERT_NEAR(y[i], want[i], 1e-2 * mag + 1e-6) << "t " << t << " r " << r;
    }
  }
}

// Decode-sized products are our kernels alone: a CUDA graph captures them and replays the same
// bits.
TEST_P(DenseMatMulTest, DecodeIsGraphCapturable) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const DType dtype = GetParam();
  const int64_t rows = 300, cols = 1024;
  for (int64_t n_tokens : {int64_t{1}, int64_t{7}, kDecodeTokens}) {
    const HostMatrix w = MakeMatrix(dtype, rows, cols, rng);
    const DeviceBuffer<uint8_t> d_w = Upload(w.bytes);
    const DeviceMatrix dm{dtype, rows, cols, d_w.data()};
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens * cols), rng);
    const DeviceBuffer<float> d_x = Upload(x);
    const size_t n_y = static_cast<size_t>(n_tokens * rows);
    DeviceBuffer<float> d_direct = DeviceBuffer<float>::Create(n_y, "y").value();
    DeviceBuffer<float> d_graph = DeviceBuffer<float>::Create(n_y, "y").value();
    auto mm = DenseMatMul::Create(1024, cols, rows);  // prefill-capable, decode-sized calls
    ASSERT_TRUE(mm.ok()) << mm.status().message();

    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    mm->Run(dm, d_x.data(), n_tokens, d_direct.data(), stream);
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    mm->Run(dm, d_x.data(), n_tokens, d_graph.data(), stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(Download(d_graph, n_y), Download(d_direct, n_y)) << DTypeName(dtype);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// Products of one x (the q, k and v projections) together: the bits of each alone, whether x is
// quantized once for all (decode, quantized weights) or each runs on its own (prefill, floats).
TEST_P(DenseMatMulTest, RunAllGivesEachRunsBits) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const DType dtype = GetParam();
  const int64_t cols = 512;
  const std::vector<int64_t> rows = {256, 64, 96};
  for (int64_t n_tokens : {int64_t{1}, int64_t{5}, int64_t{70}}) {
    std::vector<HostMatrix> host;
    std::vector<DeviceBuffer<uint8_t>> d_w;
    std::vector<DeviceMatrix> mats;
    for (int64_t r : rows) {
      host.push_back(MakeMatrix(dtype, r, cols, rng));
      d_w.push_back(Upload(host.back().bytes));
      mats.push_back(DeviceMatrix{dtype, r, cols, d_w.back().data()});
    }
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens * cols), rng);
    const DeviceBuffer<float> d_x = Upload(x);
    auto mm = DenseMatMul::Create(n_tokens, cols, 256);
    ASSERT_TRUE(mm.ok()) << mm.status().message();
    std::vector<DeviceBuffer<float>> alone, together;
    std::vector<DenseMatMul::Product> products;
    for (size_t m = 0; m < rows.size(); ++m) {
      const auto n_y = static_cast<size_t>(n_tokens * rows[m]);
      alone.push_back(DeviceBuffer<float>::Create(n_y, "y").value());
      together.push_back(DeviceBuffer<float>::Create(n_y, "y").value());
      mm->Run(mats[m], d_x.data(), n_tokens, alone.back().data(), nullptr);
      products.push_back({&mats[m], together.back().data()});
    }
    mm->RunAll(products, d_x.data(), n_tokens, nullptr);
    for (size_t m = 0; m < rows.size(); ++m) {
      const auto n_y = static_cast<size_t>(n_tokens * rows[m]);
      EXPECT_EQ(Download(together[m], n_y), Download(alone[m], n_y))
          << DTypeName(dtype) << " tokens " << n_tokens << " matrix " << m;
    }
  }
}

// x handed over already quantized (as a norm writes it beside its output): Run and RunAll read
// it instead of quantizing x, with the same bits; float formats ignore it. Lists long enough
// that a warp takes several rows (each matrix padded to them) included.
TEST_P(DenseMatMulTest, QuantizedXGivesTheSameBits) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const DType dtype = GetParam();
  struct Case {
    int64_t cols;
    std::vector<int64_t> rows;
  };
  for (const Case& c : {Case{512, {256, 64, 96}}, Case{64, {8461, 37, 5}}}) {
    for (int64_t n_tokens : {int64_t{1}, int64_t{3}, int64_t{9}}) {
      std::vector<HostMatrix> host;
      std::vector<DeviceBuffer<uint8_t>> d_w;
      std::vector<DeviceMatrix> mats;
      int64_t max_rows = 0;
      for (int64_t r : c.rows) {
        host.push_back(MakeMatrix(dtype, r, c.cols, rng));
        d_w.push_back(Upload(host.back().bytes));
        mats.push_back(DeviceMatrix{dtype, r, c.cols, d_w.back().data()});
        max_rows = std::max(max_rows, r);
      }
      const std::vector<float> x = RandomFloats(static_cast<size_t>(n_tokens * c.cols), rng);
      const testing::HostQuantized xq = testing::QuantizeActivations(x);
      const DeviceBuffer<float> d_x = Upload(x);
      DeviceBuffer<int8_t> d_q = Upload(xq.q);
      DeviceBuffer<float> d_d = Upload(xq.d);
      const QuantizedActs x8{d_q.data(), d_d.data()};
      auto mm = DenseMatMul::Create(n_tokens, c.cols, max_rows);
      ASSERT_TRUE(mm.ok()) << mm.status().message();
      std::vector<DeviceBuffer<float>> own, given, listed;
      std::vector<DenseMatMul::Product> products;
      for (size_t m = 0; m < c.rows.size(); ++m) {
        const auto n_y = static_cast<size_t>(n_tokens * c.rows[m]);
        for (auto* v : {&own, &given, &listed})
          v->push_back(DeviceBuffer<float>::Create(n_y, "y").value());
        mm->Run(mats[m], d_x.data(), n_tokens, own.back().data(), nullptr);
        mm->Run(mats[m], d_x.data(), n_tokens, given.back().data(), nullptr, &x8);
        products.push_back({&mats[m], listed.back().data()});
      }
      mm->RunAll(products, d_x.data(), n_tokens, nullptr, &x8);
      for (size_t m = 0; m < c.rows.size(); ++m) {
        const auto n_y = static_cast<size_t>(n_tokens * c.rows[m]);
        const std::vector<float> want = Download(own[m], n_y);
        EXPECT_EQ(Download(given[m], n_y), want)
            << DTypeName(dtype) << " tokens " << n_tokens << " matrix " << m;
        EXPECT_EQ(Download(listed[m], n_y), want)
            << DTypeName(dtype) << " tokens " << n_tokens << " matrix " << m << " (listed)";
      }
    }
  }
}

TEST_P(DenseMatMulTest, NoTokensLaunchNothing) {
  MT_REQUIRE_GPU();
  auto mm = DenseMatMul::Create(4, 64, 8);
  ASSERT_TRUE(mm.ok()) << mm.status().message();
  mm->Run(DeviceMatrix{GetParam(), 8, 64, nullptr}, nullptr, 0, nullptr, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(AllWeightDtypes, DenseMatMulTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                           DType::kQ4_0),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Timing, not a check (run with --gtest_also_run_disabled_tests): weight bandwidth of model-
// sized products against the H200's 4.8 TB/s, and prefill throughput. Median of 20 runs.
TEST(DenseMatMulBench, DISABLED_Bandwidth) {
  MT_REQUIRE_GPU();
  struct Mat {
    const char* name;
    int64_t rows, cols;
  };
  const Mat mats[] = {{"lm_head", 151936, 2048}, {"qkv", 4096, 2048}, {"o", 2048, 4096}};
  const int64_t token_counts[] = {1, 2, 4, 8, 16, 32, 64, 65, 128, 512, 2048};
  auto mm = DenseMatMul::Create(2048, 4096, 151936);
  ASSERT_TRUE(mm.ok()) << mm.status().message();
  DeviceBuffer<float> d_x = DeviceBuffer<float>::Create(2048 * 4096, "x").value();
  DeviceBuffer<float> d_y = DeviceBuffer<float>::Create(2048 * 151936, "y").value();
  {
    std::mt19937 rng(1);
    const std::vector<float> x = RandomFloats(2048 * 4096, rng);
    ASSERT_EQ(cudaMemcpy(d_x.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  for (DType dtype : {DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kF16, DType::kF32}) {
    for (const Mat& m : mats) {
      const size_t bytes = DTypeRowBytes(dtype, m.cols) * static_cast<size_t>(m.rows);
      DeviceBuffer<uint8_t> d_w = DeviceBuffer<uint8_t>::Create(bytes, "w").value();
      ASSERT_EQ(cudaMemset(d_w.data(), 0x11, bytes), cudaSuccess);  // small finite values
      const DeviceMatrix dm{dtype, m.rows, m.cols, d_w.data()};
      for (int64_t n_tokens : token_counts) {
        const double sec =
            testing::MedianGpuMs([&] { mm->Run(dm, d_x.data(), n_tokens, d_y.data(), nullptr); }) *
            1e-3;
        const double gbs = static_cast<double>(bytes) / sec * 1e-9;
        const double tflops = 2.0 * m.rows * m.cols * n_tokens / sec * 1e-12;
        std::printf(
            "{\"dtype\":\"%s\",\"matrix\":\"%s\",\"tokens\":%lld,\"us\":%.1f,\"weight_GBps\":"
            "%.0f,\"pct_of_4800\":%.1f,\"TFLOPs\":%.1f}\n",
            std::string(DTypeName(dtype)).c_str(), m.name, static_cast<long long>(n_tokens),
            sec * 1e6, gbs, gbs / 48.0, tflops);
      }
    }
  }
}

}  // namespace
}  // namespace moetier::cuda
