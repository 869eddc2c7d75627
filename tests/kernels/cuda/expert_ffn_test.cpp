// The GPU routed experts (kernels/cuda/expert_ffn.h) against the CPU expert executor
// (experts/cpu_executor.h) on the same random experts, inputs and routing: bf16, Q8_0 and Q4_0
// weights, the decode and the prefill (tensor-core) paths, 1 to 600 tokens, 8 and 128 experts,
// top-2 and top-8, experts without tokens, rows whose bytes are not 16-byte (or 4-byte) aligned.
// The device routing is filled on the host from the host Routing, so these tests do not depend
// on the router kernels.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "experts/cpu_executor.h"
#include "experts/expert_table.h"
#include "experts/routing.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/expert_ffn.h"
#include "kernels/cuda/routing.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier {
namespace {

using cuda::DeviceBuffer;
using cuda::ExpertFfn;
using cuda::ExpertFfnOptions;
using cuda::ExpertFfnPath;
using cuda::ExpertPointers;
using cuda::ExpertShape;

// ---------------------------------------------------------------------------------------------
// Host experts (the CPU executor's source) and their copy in one device bank.

struct HostExperts {
  ExpertShape shape;
  int64_t n_experts = 0;
  std::vector<std::vector<uint8_t>> bytes;  // [expert * 3 + matrix]: gate, up, down as stored
  std::vector<std::vector<float>> values;   // the same, dequantized
  ExpertTable table{1};                     // layer 0
};

// rows x cols weights ~ N(0, 1/cols) stored in shape.dtype (bf16 by truncation: what matters is
// that both sides read the same values).
void MakeMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng,
                std::vector<uint8_t>& bytes) {
  std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  const size_t row_bytes = DTypeRowBytes(dtype, cols);
  bytes.assign(row_bytes * static_cast<size_t>(rows), 0);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    uint8_t* dst = bytes.data() + static_cast<size_t>(r) * row_bytes;
    if (dtype == DType::kQ8_0) {
      kernels::QuantizeRowQ8_0(row.data(), cols, dst);
    } else if (dtype == DType::kQ4_0) {
      kernels::QuantizeRowQ4_0(row.data(), cols, dst);
    } else {
      for (int64_t i = 0; i < cols; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &row[static_cast<size_t>(i)], 4);
        const auto h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(dst + 2 * i, &h, 2);
      }
    }
  }
}

HostExperts MakeExperts(const ExpertShape& shape, int64_t n_experts, std::mt19937& rng) {
  HostExperts ex;
  ex.shape = shape;
  ex.n_experts = n_experts;
  ex.bytes.resize(static_cast<size_t>(n_experts * 3));
  ex.values.resize(ex.bytes.size());
  std::vector<ExpertWeights> weights;
  for (int64_t e = 0; e < n_experts; ++e) {
    TensorView views[3];
    for (int m = 0; m < 3; ++m) {
      const int64_t rows = m < 2 ? shape.width : shape.d_model;
      const int64_t cols = m < 2 ? shape.d_model : shape.width;
      const auto i = static_cast<size_t>(e * 3 + m);
      MakeMatrix(shape.dtype, rows, cols, rng, ex.bytes[i]);
      views[m] = TensorView{shape.dtype, {rows, cols}, ex.bytes[i].data(), ex.bytes[i].size()};
      ex.values[i].resize(static_cast<size_t>(rows * cols));
      kernels::RowToF32(views[m], 0, rows * cols, ex.values[i].data());
    }
    weights.push_back(ExpertWeights{views[0], views[1], views[2]});
  }
  ex.table.SetLayer(0, std::move(weights));
  return ex;
}

template <typename T>
DeviceBuffer<T> Upload(const std::vector<T>& v) {
  DeviceBuffer<T> b = DeviceBuffer<T>::Create(v.size(), "test upload").value();
  EXPECT_EQ(cudaSuccess,
            cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

// One bank for the layer, expert after expert; `packed` puts every matrix right after the
// previous one (Q8_0/Q4_0 matrices then start only 2-byte aligned), otherwise at 256 bytes.
struct DeviceExperts {
  DeviceBuffer<uint8_t> bank;
  DeviceBuffer<ExpertPointers> table;
};
DeviceExperts UploadExperts(const HostExperts& ex, bool packed) {
  std::vector<size_t> offsets;
  size_t end = 0;
  for (const auto& m : ex.bytes) {
    if (!packed) end = (end + 255) / 256 * 256;
    offsets.push_back(end);
    end += m.size();
  }
  std::vector<uint8_t> image(end, 0);
  for (size_t i = 0; i < ex.bytes.size(); ++i)
    std::memcpy(image.data() + offsets[i], ex.bytes[i].data(), ex.bytes[i].size());
  DeviceExperts dev;
  dev.bank = Upload(image);
  std::vector<ExpertPointers> table(static_cast<size_t>(ex.n_experts));
  for (size_t e = 0; e < table.size(); ++e) {
    const uint8_t* base = dev.bank.data();
    table[e] =
        ExpertPointers{base + offsets[e * 3], base + offsets[e * 3 + 1], base + offsets[e * 3 + 2]};
  }
  dev.table = Upload(table);
  return dev;
}

// ---------------------------------------------------------------------------------------------
// Routing: random distinct experts per token (from every `stride`-th expert), grouped on the
// host, then copied into a DeviceRouting.

struct StepRouting {
  Routing host;
  int64_t n_experts = 0;
  int64_t top_k = 0;
};

StepRouting MakeRouting(int64_t n_tokens, int64_t n_experts, int64_t top_k, std::mt19937& rng,
                        int64_t stride = 1) {
  std::vector<int32_t> allowed;
  for (int32_t e = 0; e < n_experts; e += static_cast<int32_t>(stride)) allowed.push_back(e);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::shuffle(allowed.begin(), allowed.end(), rng);
    float sum = 0.0f;
    std::vector<float> w(static_cast<size_t>(top_k));
    for (float& v : w) sum += (v = weight(rng));
    for (int64_t k = 0; k < top_k; ++k) {
      ids.push_back(allowed[static_cast<size_t>(k)]);
      weights.push_back(w[static_cast<size_t>(k)] / sum);
    }
  }
  StepRouting s;
  s.n_experts = n_experts;
  s.top_k = top_k;
  std::vector<int32_t> start;
  s.host.Group(ids.data(), weights.data(), n_tokens, top_k, n_experts, start);
  return s;
}

// The same routing restricted to token t (for the batching test).
StepRouting SingleToken(const StepRouting& s, int64_t t) {
  std::vector<std::pair<int32_t, float>> chosen;  // (expert, weight), experts ascending
  for (size_t a = 0; a < s.host.n_active(); ++a)
    for (int64_t j = s.host.first(a); j < s.host.first(a) + s.host.count(a); ++j)
      if (s.host.token_of[static_cast<size_t>(j)] == t)
        chosen.emplace_back(s.host.experts[a], s.host.weight_of[static_cast<size_t>(j)]);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (const auto& [e, w] : chosen) ids.push_back(e), weights.push_back(w);
  StepRouting one;
  one.n_experts = s.n_experts;
  one.top_k = s.top_k;
  std::vector<int32_t> start;
  one.host.Group(ids.data(), weights.data(), 1, s.top_k, s.n_experts, start);
  return one;
}

struct DeviceRoutingBuffers {
  DeviceBuffer<int32_t> n_active, experts, begin, token_of, assign_of;
  DeviceBuffer<float> weight_of;
  cuda::DeviceRouting view;
};

DeviceRoutingBuffers UploadRouting(const StepRouting& s) {
  const Routing& r = s.host;
  const auto n_active = static_cast<int32_t>(r.n_active());
  std::vector<int32_t> experts(static_cast<size_t>(s.n_experts), -1);
  std::copy(r.experts.begin(), r.experts.end(), experts.begin());
  std::vector<int32_t> begin(static_cast<size_t>(s.n_experts + 1), r.begin.back());
  std::copy(r.begin.begin(), r.begin.end(), begin.begin());
  // Token t's assignments, experts ascending: expert-major order visits them that way.
  std::vector<int32_t> assign_of(r.n_assignments());
  std::vector<int64_t> filled(static_cast<size_t>(r.n_tokens), 0);
  for (size_t j = 0; j < r.n_assignments(); ++j) {
    const auto t = static_cast<size_t>(r.token_of[j]);
    assign_of[t * static_cast<size_t>(s.top_k) + static_cast<size_t>(filled[t]++)] =
        static_cast<int32_t>(j);
  }
  DeviceRoutingBuffers d;
  d.n_active = Upload(std::vector<int32_t>{n_active});
  d.experts = Upload(experts);
  d.begin = Upload(begin);
  d.token_of = Upload(r.token_of);
  d.weight_of = Upload(r.weight_of);
  d.assign_of = Upload(assign_of);
  d.view.n_tokens = r.n_tokens;
  d.view.top_k = s.top_k;
  d.view.n_experts = s.n_experts;
  d.view.n_active = d.n_active.data();
  d.view.experts = d.experts.data();
  d.view.begin = d.begin.data();
  d.view.token_of = d.token_of.data();
  d.view.weight_of = d.weight_of.data();
  d.view.assign_of = d.assign_of.data();
  return d;
}

// ---------------------------------------------------------------------------------------------
// Running both sides.

std::vector<float> RandomInput(int64_t n_tokens, int64_t d_model, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * d_model));
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<float> RunCpu(const HostExperts& ex, const StepRouting& s,
                          const std::vector<float>& x) {
  ThreadPool pool(2);
  CpuExpertExecutor exec(ex.table, pool, ex.shape.d_model);
  std::vector<float> out(x.size(), NAN);
  exec.Run(0, s.host, x.data(), out.data());
  return out;
}

// out = the GPU's result (NaN-filled first, so an element never written shows). With
// pre_quantized, Run is handed x quantized by the CPU's formula (Q8_0/Q4_0: CudaBackend's norms
// write it so) instead of quantizing x itself.
void RunGpu(const HostExperts& ex, const DeviceExperts& dev, const StepRouting& s,
            const std::vector<float>& x, ExpertFfnPath path, std::vector<float>* out,
            int64_t max_tokens = 0, bool pre_quantized = false) {
  const int64_t n_tokens = s.host.n_tokens;
  Expected<ExpertFfn> ffn =
      ExpertFfn::Create(ex.shape, std::max(max_tokens, n_tokens), s.top_k, ExpertFfnOptions{path});
  ASSERT_TRUE(ffn.ok()) << ffn.message();
  DeviceRoutingBuffers routing = UploadRouting(s);
  DeviceBuffer<float> x_dev = Upload(x);
  DeviceBuffer<float> out_dev = DeviceBuffer<float>::Create(x.size(), "test out").value();
  ASSERT_EQ(cudaSuccess, cudaMemset(out_dev.data(), 0xFF, out_dev.bytes()));
  DeviceBuffer<int8_t> x_q;
  DeviceBuffer<float> x_d;
  if (pre_quantized) {
    const testing::HostQuantized host = testing::QuantizeActivations(x);
    x_q = Upload(host.q);
    x_d = Upload(host.d);
  }
  const cuda::QuantizedActs x8{x_q.data(), x_d.data()};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreate(&stream));
  ffn->Run(routing.view, dev.table.data(), x_dev.data(), out_dev.data(), stream, nullptr,
           pre_quantized ? &x8 : nullptr);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(stream));
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  out->assign(x.size(), 0.0f);
  ASSERT_EQ(cudaSuccess,
            cudaMemcpy(out->data(), out_dev.data(), out_dev.bytes(), cudaMemcpyDeviceToHost));
}

// ---------------------------------------------------------------------------------------------
// Tolerances.

// The CPU's activation quantizer (documented in kernels/cpu/matmul_scalar.cpp), used here only
// to size the decode tolerance: value = q * amax / 127, step = amax / 127, frac = distance of
// x * (127 / amax) from the nearest rounding boundary.
struct QuantizedAct {
  std::vector<double> value, step, frac;
};
QuantizedAct QuantizeActs(const float* v, int64_t n) {
  QuantizedAct a{std::vector<double>(static_cast<size_t>(n)),
                 std::vector<double>(static_cast<size_t>(n)),
                 std::vector<double>(static_cast<size_t>(n))};
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0.0f;
    for (int64_t j = b; j < b + 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = b; j < b + 32; ++j) {
      const float s = std::fmin(127.0f, std::fmax(-127.0f, v[j] * id));
      const float q = std::nearbyint(s);
      const auto i = static_cast<size_t>(j);
      a.value[i] = static_cast<double>(q) * d;
      a.step[i] = d;
      a.frac[i] = std::abs(0.5 - std::abs(static_cast<double>(s) - q));
    }
  }
  return a;
}

// How far the decode path and the CPU may each stray from the exact result, per output element:
// both sum in fp32 in different orders (kRel = 1e-5 of the sum of magnitudes is far above
// fp32's error for these lengths: ~n/32 + 5 rounding steps of 6e-8 in the worst case), and for
// Q8_0/Q4_0 each computes h in fp32 before quantizing it to 8 bits, so where the exact h lies
// closer to a rounding boundary than those errors, either side may take the neighbouring code:
// one step (amax / 127) on that element. Computed from a double-precision h of the same
// (dequantized) weights and quantized inputs. The inputs x are quantized identically on both
// sides (the same float operations), so they add nothing.
std::vector<double> DecodeBound(const HostExperts& ex, const StepRouting& s,
                                const std::vector<float>& x) {
  constexpr double kRel = 1e-5;
  const bool quant = IsBlockQuantized(ex.shape.dtype);
  const int64_t D = ex.shape.d_model, W = ex.shape.width;
  const Routing& r = s.host;
  std::vector<double> bound(x.size(), 0.0);
  std::vector<double> h(static_cast<size_t>(W)), h_err(h.size()), flip(h.size());
  for (size_t a = 0; a < r.n_active(); ++a) {
    const auto e = static_cast<size_t>(r.experts[a]);
    const std::vector<float>& g = ex.values[e * 3];
    const std::vector<float>& u = ex.values[e * 3 + 1];
    const std::vector<float>& dn = ex.values[e * 3 + 2];
    for (int64_t j = r.first(a); j < r.first(a) + r.count(a); ++j) {
      const int64_t t = r.token_of[static_cast<size_t>(j)];
      const double wt = r.weight_of[static_cast<size_t>(j)];
      const float* xt = x.data() + t * D;
      std::vector<double> xin(xt, xt + D);
      if (quant) xin = QuantizeActs(xt, D).value;
      for (int64_t i = 0; i < W; ++i) {
        double gs = 0, us = 0, gm = 0, um = 0;
        for (int64_t c = 0; c < D; ++c) {
          const double gi = g[static_cast<size_t>(i * D + c)] * xin[static_cast<size_t>(c)];
          const double ui = u[static_cast<size_t>(i * D + c)] * xin[static_cast<size_t>(c)];
          gs += gi, us += ui, gm += std::abs(gi), um += std::abs(ui);
        }
        const double silu = gs / (1 + std::exp(-gs));
        h[static_cast<size_t>(i)] = silu * us;
        h_err[static_cast<size_t>(i)] = kRel * (1.1 * gm * std::abs(us) + std::abs(silu) * um);
      }
      std::vector<double> hin = h;
      std::fill(flip.begin(), flip.end(), 0.0);
      if (quant) {
        const std::vector<float> hf(h.begin(), h.end());
        const QuantizedAct hq = QuantizeActs(hf.data(), W);
        hin = hq.value;
        for (size_t i = 0; i < flip.size(); ++i) {
          const double step = hq.step[i];
          if (step > 0 && hq.frac[i] * step <= h_err[i] + kRel * step * 127) flip[i] = step;
        }
      }
      for (int64_t o = 0; o < D; ++o) {
        double mag = 0, flips = 0;
        for (int64_t i = 0; i < W; ++i) {
          const auto ii = static_cast<size_t>(i);
          const double dv = std::abs(dn[static_cast<size_t>(o * W + i)]);
          mag += dv * (std::abs(hin[ii]) + h_err[ii]);
          flips += dv * flip[ii];
        }
        bound[static_cast<size_t>(t * D + o)] += wt * (kRel * mag + flips);
      }
    }
  }
  return bound;
}

// GPU and CPU each within DecodeBound of the exact result, so within twice it of each other.
void ExpectDecodeMatch(const std::vector<float>& gpu, const std::vector<float>& cpu,
                       const std::vector<double>& bound, int64_t d_model, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double err = std::abs(static_cast<double>(gpu[i]) - cpu[i]);
    if (!(err <= 2 * bound[i]) && bad++ < 5)
      ADD_FAILURE() << what << ": token " << i / static_cast<size_t>(d_model) << ", element "
                    << i % static_cast<size_t>(d_model) << ": GPU " << gpu[i] << ", CPU " << cpu[i]
                    << ", allowed ±" << 2 * bound[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// Both paths, every dtype: the bf16 GEMMs split x and h into two bf16 parts (2^-18 relative,
// below the bound's 1e-5), and the Q8_0/Q4_0 GEMMs do the decode path's arithmetic (the same
// 8-bit activations, exact integer block dots) in another fp32 order.
void ExpectMatch(const HostExperts& ex, const StepRouting& s, const std::vector<float>& x,
                 const std::vector<float>& gpu, const std::string& what) {
  const std::vector<float> cpu = RunCpu(ex, s, x);
  ExpectDecodeMatch(gpu, cpu, DecodeBound(ex, s, x), ex.shape.d_model, what);
}

std::string Describe(DType dtype, ExpertFfnPath path, int64_t n_tokens, int64_t n_experts,
                     int64_t top_k, const ExpertShape& shape) {
  return std::string(DTypeName(dtype)) + (path == ExpertFfnPath::kDecode ? " decode" : " prefill") +
         ", T=" + std::to_string(n_tokens) + ", E=" + std::to_string(n_experts) +
         ", top_k=" + std::to_string(top_k) + ", d_model " + std::to_string(shape.d_model) +
         ", width " + std::to_string(shape.width);
}

// One case: fresh experts, routing and input, the GPU against the CPU.
void CheckCase(DType dtype, ExpertFfnPath path, const ExpertShape& shape_in, int64_t n_tokens,
               int64_t n_experts, int64_t top_k, std::mt19937& rng, int64_t stride = 1,
               bool packed = false) {
  ExpertShape shape = shape_in;
  shape.dtype = dtype;
  const std::string what = Describe(dtype, path, n_tokens, n_experts, top_k, shape);
  SCOPED_TRACE(what);
  const HostExperts ex = MakeExperts(shape, n_experts, rng);
  const DeviceExperts dev = UploadExperts(ex, packed);
  const StepRouting s = MakeRouting(n_tokens, n_experts, top_k, rng, stride);
  const std::vector<float> x = RandomInput(n_tokens, shape.d_model, rng);
  std::vector<float> gpu;
  ASSERT_NO_FATAL_FAILURE(RunGpu(ex, dev, s, x, path, &gpu));
  ExpectMatch(ex, s, x, gpu, what);
}

// ---------------------------------------------------------------------------------------------
// Tests, for every dtype and both paths.

class ExpertFfnTest : public ::testing::TestWithParam<std::tuple<DType, ExpertFfnPath>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  ExpertFfnPath path() const { return std::get<1>(GetParam()); }
};

// d_model 160 and width 96: 5 and 3 blocks a row, so Q8_0/Q4_0 rows are only 2-byte aligned
// (170/102 and 90/54 bytes) and no dimension is a multiple of the tiles (16 decode rows,
// 64x64 bf16 and 32x128 int8 GEMM tiles, 256-2048-column chunks).
constexpr ExpertShape kSmall{DType::kBF16, 160, 96};

TEST_P(ExpertFfnTest, MatchesCpuExecutor) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const std::pair<int64_t, int64_t> configs[] = {{8, 2}, {128, 8}};  // (n_experts, top_k)
  for (const auto& [n_experts, top_k] : configs)
    for (int64_t n_tokens : {1, 7, 64, 600})
      CheckCase(dtype(), path(), kSmall, n_tokens, n_experts, top_k, rng);
}

// Rows longer than a chunk (several staged chunks, the double buffer), 16-byte aligned rows
// (d_model 2304: 72 blocks) and 4-byte aligned ones (width 2112: 66 blocks), experts with more
// tokens than a decode pass (8) or a GEMM tile (64).
TEST_P(ExpertFfnTest, LongRows) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (const ExpertShape& shape :
       {ExpertShape{DType::kBF16, 2304, 576}, ExpertShape{DType::kBF16, 160, 2112}})
    for (int64_t n_tokens : {5, 150}) CheckCase(dtype(), path(), shape, n_tokens, 4, 2, rng);
}

// Only even experts are ever chosen: the odd ones have no tokens (and table entries that must
// not be read), and every matrix starts right after the previous one in the bank.
TEST_P(ExpertFfnTest, ExpertsWithoutTokensAndPackedBank) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (int64_t n_tokens : {1, 20, 300})
    CheckCase(dtype(), path(), kSmall, n_tokens, 16, 4, rng, /*stride=*/2, /*packed=*/true);
}

// A call with fewer tokens than the ExpertFfn was created for.
TEST_P(ExpertFfnTest, FewerTokensThanCreatedFor) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  ExpertShape shape = kSmall;
  shape.dtype = dtype();
  const HostExperts ex = MakeExperts(shape, 8, rng);
  const DeviceExperts dev = UploadExperts(ex, false);
  const StepRouting s = MakeRouting(9, 8, 2, rng);
  const std::vector<float> x = RandomInput(9, shape.d_model, rng);
  std::vector<float> gpu;
  ASSERT_NO_FATAL_FAILURE(RunGpu(ex, dev, s, x, path(), &gpu, /*max_tokens=*/1000));
  ExpectMatch(ex, s, x, gpu, "9 of 1000 tokens");
}

INSTANTIATE_TEST_SUITE_P(
    DtypesAndPaths, ExpertFfnTest,
    ::testing::Combine(::testing::Values(DType::kBF16, DType::kQ8_0, DType::kQ4_0),
                       ::testing::Values(ExpertFfnPath::kDecode, ExpertFfnPath::kPrefill)),
    [](const auto& info) {
      return std::string(DTypeName(std::get<0>(info.param))) +
             (std::get<1>(info.param) == ExpertFfnPath::kDecode ? "_Decode" : "_Prefill");
    });

// bf16 takes any even size: rows of 50 and 70 values (partial 8-value units, 4-byte aligned
// rows, K tails in the GEMM).
TEST(ExpertFfnBf16, EvenSizesNotMultiplesOf32) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (ExpertFfnPath path : {ExpertFfnPath::kDecode, ExpertFfnPath::kPrefill})
    for (int64_t n_tokens : {1, 7, 64, 600})
      CheckCase(DType::kBF16, path, ExpertShape{DType::kBF16, 50, 70}, n_tokens, 8, 2, rng, 1,
                /*packed=*/true);
}

// The decode path gives a token's output bit for bit whether it runs alone or in a batch: each
// output element's operations depend only on its token, expert and row (the split over lanes and
// chunks is fixed by the shape) and the routed sum adds in a fixed order. A token alone (4
// assignments) runs on the one-warp-a-row kernels with the routed sum in the down launch, the
// batch (52) on the tiled ones and the routed-sum launch: the same bits. kSmall's quantized rows
// are 2-byte aligned; 2304 x 576 has 16-byte aligned rows longer than a staged chunk.
TEST(ExpertFfnDecode, TokenAloneEqualsTokenInBatch) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (const ExpertShape& base : {kSmall, ExpertShape{DType::kBF16, 2304, 576}})
    for (DType dtype : {DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::to_string(base.d_model) + "x" +
                   std::to_string(base.width));
      ExpertShape shape = base;
      shape.dtype = dtype;
      const HostExperts ex = MakeExperts(shape, 16, rng);
      const DeviceExperts dev = UploadExperts(ex, false);
      const int64_t T = 13;
      const StepRouting s = MakeRouting(T, 16, 4, rng);
      const std::vector<float> x = RandomInput(T, shape.d_model, rng);
      std::vector<float> batch;
      ASSERT_NO_FATAL_FAILURE(RunGpu(ex, dev, s, x, ExpertFfnPath::kDecode, &batch));
      for (int64_t t = 0; t < T; ++t) {
        const std::vector<float> xt(x.begin() + t * shape.d_model,
                                    x.begin() + (t + 1) * shape.d_model);
        std::vector<float> alone;
        ASSERT_NO_FATAL_FAILURE(
            RunGpu(ex, dev, SingleToken(s, t), xt, ExpertFfnPath::kDecode, &alone));
        EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + t * shape.d_model,
                                 alone.size() * sizeof(float)))
            << "token " << t;
      }
    }
}

// x handed over already quantized (as CudaBackend's norms write it) gives the bits of x
// quantized by the experts' own launch: one token (the one-warp-a-row kernels) and a batch (the
// tiled ones), rows 2-byte aligned (kSmall) and longer than a staged chunk.
TEST(ExpertFfnDecode, PreQuantizedInputGivesTheSameBits) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (const ExpertShape& base : {kSmall, ExpertShape{DType::kQ8_0, 2304, 576}})
    for (DType dtype : {DType::kQ8_0, DType::kQ4_0})
      for (int64_t T : {1, 13}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::to_string(base.d_model) + "x" +
                     std::to_string(base.width) + ", T=" + std::to_string(T));
        ExpertShape shape = base;
        shape.dtype = dtype;
        const HostExperts ex = MakeExperts(shape, 16, rng);
        const DeviceExperts dev = UploadExperts(ex, false);
        const StepRouting s = MakeRouting(T, 16, 4, rng);
        const std::vector<float> x = RandomInput(T, shape.d_model, rng);
        std::vector<float> own, handed;
        ASSERT_NO_FATAL_FAILURE(RunGpu(ex, dev, s, x, ExpertFfnPath::kDecode, &own));
        ASSERT_NO_FATAL_FAILURE(
            RunGpu(ex, dev, s, x, ExpertFfnPath::kDecode, &handed, 0, /*pre_quantized=*/true));
        EXPECT_EQ(0, std::memcmp(own.data(), handed.data(), own.size() * sizeof(float)));
        ExpectMatch(ex, s, x, handed, "pre-quantized x");
      }
}

// The hybrid split's mechanism: experts whose table entries point at an expert of zeros add
// exactly nothing, and RoutedSum adds a partial sum computed elsewhere (here the CPU executor
// over those experts' assignments) after the GPU's: together within the decode tolerance of the
// CPU executor over the whole routing, and the partial added as one fp32 addition.
TEST(ExpertFfnSplit, ZeroedExpertsPlusAPartialSumMatchTheWholeRouting) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  for (DType dtype : {DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    ExpertShape shape = kSmall;
    shape.dtype = dtype;
    const int64_t E = 16, T = 5, K = 4;
    const HostExperts ex = MakeExperts(shape, E, rng);
    const DeviceExperts dev = UploadExperts(ex, false);
    const StepRouting s = MakeRouting(T, E, K, rng);
    const std::vector<float> x = RandomInput(T, shape.d_model, rng);

    // Odd experts go to the "CPU": their table entries read zeros on the GPU.
    size_t zero_bytes = 0;
    for (const auto& m : ex.bytes) zero_bytes = std::max(zero_bytes, m.size());
    DeviceBuffer<uint8_t> zeros = Upload(std::vector<uint8_t>(zero_bytes, 0));
    std::vector<ExpertPointers> table(static_cast<size_t>(E));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(table.data(), dev.table.data(), dev.table.bytes(),
                                      cudaMemcpyDeviceToHost));
    for (int64_t e = 1; e < E; e += 2)
      table[static_cast<size_t>(e)] = ExpertPointers{zeros.data(), zeros.data(), zeros.data()};
    DeviceBuffer<ExpertPointers> split_table = Upload(table);
    StepRouting odd;
    odd.n_experts = E;
    odd.top_k = K;
    odd.host.n_tokens = T;
    odd.host.begin.assign(1, 0);
    for (size_t a = 0; a < s.host.n_active(); ++a) {
      if (s.host.experts[a] % 2 == 0) continue;
      odd.host.experts.push_back(s.host.experts[a]);
      for (int64_t j = s.host.first(a); j < s.host.first(a) + s.host.count(a); ++j) {
        odd.host.token_of.push_back(s.host.token_of[static_cast<size_t>(j)]);
        odd.host.weight_of.push_back(s.host.weight_of[static_cast<size_t>(j)]);
      }
      odd.host.begin.push_back(static_cast<int32_t>(odd.host.token_of.size()));
    }
    ASSERT_FALSE(odd.host.experts.empty());
    const std::vector<float> partial = RunCpu(ex, odd, x);

    Expected<ExpertFfn> ffn =
        ExpertFfn::Create(ex.shape, T, K, ExpertFfnOptions{ExpertFfnPath::kDecode});
    ASSERT_TRUE(ffn.ok()) << ffn.message();
    DeviceRoutingBuffers routing = UploadRouting(s);
    DeviceBuffer<float> x_dev = Upload(x);
    DeviceBuffer<float> partial_dev = Upload(partial);
    DeviceBuffer<float> gpu_only = DeviceBuffer<float>::Create(x.size(), "test out").value();
    DeviceBuffer<float> both = DeviceBuffer<float>::Create(x.size(), "test out").value();
    ffn->RunExperts(routing.view, split_table.data(), x_dev.data(), nullptr);
    ffn->RoutedSum(routing.view, nullptr, gpu_only.data(), nullptr);
    DeviceBuffer<int32_t> record = Upload(std::vector<int32_t>{-1});
    ffn->RoutedSum(routing.view, partial_dev.data(), both.data(), nullptr, record.data());
    const std::vector<float> a = testing::Download(gpu_only, x.size());
    const std::vector<float> b = testing::Download(both, x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(b[i], a[i] + partial[i]) << "element " << i;
    EXPECT_EQ(testing::Download(record, 1)[0], static_cast<int32_t>(s.host.n_active()))
        << "the count of active experts the routed sum records";
    ExpectMatch(ex, s, x, b, "split between zeroed experts and a partial");
  }
}

// kAuto takes the decode kernels for a decode step and the GEMMs for a prefill-sized step
// (150 tokens per expert): bit-identical to the forced path.
TEST(ExpertFfnAuto, PicksDecodeForFewAndPrefillForManyTokensPerExpert) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  ExpertShape shape = kSmall;
  shape.dtype = DType::kQ8_0;
  const HostExperts ex = MakeExperts(shape, 8, rng);
  const DeviceExperts dev = UploadExperts(ex, false);
  const std::pair<int64_t, ExpertFfnPath> cases[] = {{1, ExpertFfnPath::kDecode},
                                                     {600, ExpertFfnPath::kPrefill}};
  for (const auto& [n_tokens, forced] : cases) {
    const StepRouting s = MakeRouting(n_tokens, 8, 2, rng);
    const std::vector<float> x = RandomInput(n_tokens, shape.d_model, rng);
    std::vector<float> a, b;
    ASSERT_NO_FATAL_FAILURE(RunGpu(ex, dev, s, x, ExpertFfnPath::kAuto, &a));
    ASSERT_NO_FATAL_FAILURE(RunGpu(ex, dev, s, x, forced, &b));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
        << n_tokens << " tokens";
  }
}

// Shapes the kernels cannot run are refused at Create, naming the sizes (no device needed).
TEST(ExpertFfnCreate, RefusesUnsupportedShapes) {
  const auto message = [](const ExpertShape& shape) {
    Expected<ExpertFfn> ffn = ExpertFfn::Create(shape, 4, 2);
    return ffn.ok() ? std::string("ok") : ffn.message();
  };
  EXPECT_NE(message({DType::kQ8_0, 48, 64}).find("multiples of 32"), std::string::npos);
  EXPECT_NE(message({DType::kQ4_0, 64, 80}).find("multiples of 32"), std::string::npos);
  EXPECT_NE(message({DType::kBF16, 51, 64}).find("multiples of 2"), std::string::npos);
  EXPECT_NE(message({DType::kF32, 64, 64}).find("not supported"), std::string::npos);
  EXPECT_NE(message({DType::kBF16, 0, 64}).find("positive"), std::string::npos);
}

// Timing, not a check (run with --gtest_also_run_disabled_tests): ms a call of both paths on
// Qwen3-30B-A3B's experts (128 of 2048 x 768, top-8) from 1 to 4,096 tokens, the median of 20:
// where the GEMMs overtake the decode kernels (kPrefillMinTokensPerExpert* in expert_ffn.cu).
TEST(ExpertFfnBench, DISABLED_PathsByTokens) {
  MT_REQUIRE_GPU();
  constexpr int64_t kExperts = 128, kTopK = 8, kMaxTokens = 4096;
  std::mt19937 rng(1);
  const std::vector<float> x = RandomInput(kMaxTokens, 2048, rng);
  DeviceBuffer<float> x_dev = Upload(x);
  DeviceBuffer<float> out = DeviceBuffer<float>::Create(x.size(), "out").value();
  for (DType dtype : {DType::kQ4_0, DType::kQ8_0, DType::kBF16}) {
    const ExpertShape shape{dtype, 2048, 768};
    const size_t mat_bytes = (DTypeRowBytes(dtype, 2048) * 768 + 255) / 256 * 256;
    DeviceBuffer<uint8_t> bank =
        DeviceBuffer<uint8_t>::Create(mat_bytes * 3 * kExperts, "bank").value();
    ASSERT_EQ(cudaMemset(bank.data(), 0x11, bank.bytes()), cudaSuccess);  // small finite values
    std::vector<ExpertPointers> table;
    for (int64_t e = 0; e < kExperts; ++e) {
      const uint8_t* m = bank.data() + static_cast<size_t>(e) * 3 * mat_bytes;
      table.push_back(ExpertPointers{m, m + mat_bytes, m + 2 * mat_bytes});
    }
    DeviceBuffer<ExpertPointers> table_dev = Upload(table);
    for (ExpertFfnPath path : {ExpertFfnPath::kDecode, ExpertFfnPath::kPrefill}) {
      Expected<ExpertFfn> ffn = ExpertFfn::Create(shape, kMaxTokens, kTopK, ExpertFfnOptions{path});
      ASSERT_TRUE(ffn.ok()) << ffn.message();
      for (int64_t n_tokens : {1, 4, 8, 16, 32, 64, 128, 512, 4096}) {
        DeviceRoutingBuffers routing = UploadRouting(MakeRouting(n_tokens, kExperts, kTopK, rng));
        const double ms = testing::MedianGpuMs(
            [&] { ffn->Run(routing.view, table_dev.data(), x_dev.data(), out.data(), nullptr); });
        std::printf("experts %-5s %-7s %5lld tokens (%6.2f an expert): %8.3f ms\n",
                    std::string(DTypeName(dtype)).c_str(),
                    path == ExpertFfnPath::kDecode ? "decode" : "prefill",
                    static_cast<long long>(n_tokens),
                    static_cast<double>(n_tokens * kTopK) / kExperts, ms);
      }
    }
  }
}

}  // namespace
}  // namespace moetier
