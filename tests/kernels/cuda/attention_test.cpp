// The CUDA attention (prologue, decode and prefill kernels) against the CPU's AttendCpu on the
// same inputs: a host KvPool filled with random rows (the "earlier" positions of several
// sequences whose blocks are shuffled through the pool), the same bytes copied to a device pool,
// then one step — decode tokens at long positions, a prefill chunk, a mix — on both. Compared:
// q, k, v after the prologue, the pool rows the step stored, and the attention output; and the
// attention kernels alone on identical inputs (the CPU's rotated q and its pool after the step).
#include "kernels/cuda/attention.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/paged_attention.h"
#include "backend/cpu/workspace.h"
#include "backend/kv_cache.h"
#include "backend/rope.h"
#include "core/thread_pool.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier {
namespace {

constexpr int64_t kLayers = 2;
constexpr int64_t kLayer = 1;  // not the first: the layer offset in the pool is exercised
constexpr int64_t kBlockSize = KvPool::kDefaultBlockSize;
constexpr double kTheta = 1e6;

// Tolerances (|gpu - cpu| <= atol + rtol * |cpu|), and why.
// Prologue: the kernel does the CPU's operations in the CPU's order except the order of the
// double sum of squares (the norm's scale may differ in its last bit) and CUDA's double sincos
// (within 2 ulp of double; rounded to float it may differ in its last bit): a few float ulps.
constexpr double kPrologueRtol = 0x1p-20, kPrologueAtol = 0x1p-22;
// Attention on identical inputs: fp32 dot products, sums and exp in another order (online
// softmax over tiles and splits, exp2 of log2-scaled scores) than the CPU's: score errors of a
// few ulp of sum|q k| / sqrt(d) (~1e-6 at d = 128 with these magnitudes), which move the output
// by about that times max|v|; the sums over up to 4000 keys add their own rounding. Errors seen
// on an H200: up to 8e-6.
constexpr double kAttnRtol = 5e-5, kAttnAtol = 5e-5;
// End to end with a 16-bit pool, where a stored key element rounded the other way (its fp32
// value differing in the last bit) shifts a score by up to 2^-8 |q_i k_i| / sqrt(d): used only
// when such a flip happened (the test counts them), otherwise kAttn*.
constexpr double kFlipTol = 5e-2;

struct Config {
  DType dtype;
  int64_t head_dim, n_heads, n_kv_heads, window;
  bool qk_norm, bias;
};

std::string Name(const Config& c) {
  return std::string(DTypeName(c.dtype)) + " d" + std::to_string(c.head_dim) + " heads " +
         std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " window " +
         std::to_string(c.window) + (c.qk_norm ? " qk_norm" : "") + (c.bias ? " bias" : "");
}

// One step: token t is at positions[t] of sequence seq_of[t].
struct Step {
  std::string name;
  std::vector<int32_t> seq_of, positions;
};

void AddRun(Step& s, int32_t seq, int32_t pos0, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    s.seq_of.push_back(seq);
    s.positions.push_back(pos0 + i);
  }
}

std::vector<Step> Steps() {
  std::vector<Step> steps;
  steps.push_back({"decode T=1 at 3999", {0}, {3999}});
  steps.push_back({"decode T=5", {3, 0, 4, 1, 2}, {3000, 0, 17, 1500, 255}});
  Step chunk64{"chunk T=64 (decode kernel)", {}, {}};
  AddRun(chunk64, 0, 500, 64);
  steps.push_back(chunk64);
  Step prefill{"prefill T=300", {}, {}};
  AddRun(prefill, 0, 700, 300);
  steps.push_back(prefill);
  // Decode tokens of three sequences between two runs of a chunk: prefill tiles that straddle
  // several sequences.
  Step mixed{"mixed T=151", {1}, {2000}};
  AddRun(mixed, 0, 40, 70);
  AddRun(mixed, 2, 63, 1);
  AddRun(mixed, 0, 110, 78);
  AddRun(mixed, 3, 16, 1);
  steps.push_back(mixed);
  return steps;
}

// Inputs of one case on the host, and the CPU's results.
struct HostCase {
  AttentionShape shape;
  std::vector<std::vector<int32_t>> tables;  // per sequence, its blocks (shuffled ids)
  int64_t max_blocks = 0;
  KvPool pool;                  // after the CPU's step
  std::vector<uint8_t> before;  // the pool's bytes before the step
  std::vector<float> q, k, v;   // the step's inputs
  std::vector<float> inv_freq;
  AttentionWeights w;
  // The CPU's results: q, k, v after its prologue, and the output.
  std::vector<float> cpu_q, cpu_k, cpu_v, cpu_out;
};

std::vector<float> Random(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& e : v) e = dist(rng);
  return v;
}

HostCase MakeHostCase(const Config& c, const Step& step, std::mt19937& rng, ThreadPool& threads) {
  HostCase h;
  h.shape.n_heads = c.n_heads;
  h.shape.n_kv_heads = c.n_kv_heads;
  h.shape.head_dim = c.head_dim;
  h.shape.sliding_window = c.window;
  h.shape.norm_eps = 1e-6f;
  const int64_t T = static_cast<int64_t>(step.positions.size());
  const int64_t n_seqs = *std::max_element(step.seq_of.begin(), step.seq_of.end()) + 1;
  std::vector<int64_t> n_blocks_of(static_cast<size_t>(n_seqs), 1);
  for (int64_t t = 0; t < T; ++t) {
    auto& n = n_blocks_of[static_cast<size_t>(step.seq_of[static_cast<size_t>(t)])];
    n = std::max<int64_t>(n, step.positions[static_cast<size_t>(t)] / kBlockSize + 1);
  }
  const int64_t n_blocks = std::accumulate(n_blocks_of.begin(), n_blocks_of.end(), int64_t{3});
  const KvShape kv_shape{kLayers, c.n_kv_heads, c.head_dim};
  auto made = KvPool::Create(kv_shape, n_blocks, kBlockSize, c.dtype);
  EXPECT_TRUE(made.ok()) << made.message();
  h.pool = std::move(made).value();
  // Every row of the pool random: earlier positions, and rows attention must not read.
  const int64_t row = kv_shape.row();
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int64_t l = 0; l < kLayers; ++l) {
      const auto k = Random(rng, static_cast<size_t>(kBlockSize * row), -2.0f, 2.0f);
      const auto v = Random(rng, k.size(), -2.0f, 2.0f);
      h.pool.WriteRows(b, l, 0, kBlockSize, k.data(), v.data());
    }
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  for (int64_t n : n_blocks_of) {
    h.tables.emplace_back(ids.begin() + static_cast<int64_t>(next),
                          ids.begin() + static_cast<int64_t>(next) + n);
    next += static_cast<size_t>(n);
    h.max_blocks = std::max(h.max_blocks, n);
  }
  h.before.assign(h.pool.keys(0, 0), h.pool.keys(0, 0) + h.pool.bytes());

  const size_t q_n = static_cast<size_t>(T * c.n_heads * c.head_dim);
  const size_t kv_n = static_cast<size_t>(T * row);
  h.q = Random(rng, q_n, -2.0f, 2.0f);
  h.k = Random(rng, kv_n, -2.0f, 2.0f);
  h.v = Random(rng, kv_n, -2.0f, 2.0f);
  if (c.bias) {
    h.w.q_bias = Random(rng, static_cast<size_t>(c.n_heads * c.head_dim), -0.5f, 0.5f);
    h.w.k_bias = Random(rng, static_cast<size_t>(row), -0.5f, 0.5f);
    h.w.v_bias = Random(rng, static_cast<size_t>(row), -0.5f, 0.5f);
  }
  if (c.qk_norm) {  // weights up to 3: sharp softmaxes, where a wrong key shows
    h.w.q_norm = Random(rng, static_cast<size_t>(c.head_dim), 0.5f, 3.0f);
    h.w.k_norm = Random(rng, static_cast<size_t>(c.head_dim), 0.5f, 3.0f);
  }
  // The kernel's input: Rope's float32 frequencies (backend/rope.cpp computes them so).
  for (int64_t i = 0; i < c.head_dim / 2; ++i)
    h.inv_freq.push_back(static_cast<float>(
        1.0 / std::pow(kTheta, static_cast<double>(static_cast<float>(2 * i) /
                                                   static_cast<float>(c.head_dim)))));

  std::vector<std::span<const int32_t>> spans(h.tables.begin(), h.tables.end());
  Batch batch;
  batch.tokens = step.positions;  // ids are not read
  batch.positions = step.positions;
  batch.seq_of = step.seq_of;
  batch.block_tables = spans;
  h.cpu_q = h.q, h.cpu_k = h.k, h.cpu_v = h.v;
  h.cpu_out.assign(q_n, NAN);
  Workspace ws(threads);
  const Rope rope(c.head_dim, kTheta);
  AttendCpu(threads, nullptr, ws, h.w, h.shape, rope, kLayer, batch, h.pool, h.cpu_q.data(),
            h.cpu_k.data(), h.cpu_v.data(), h.cpu_out.data());
  return h;
}

// A device allocation holding a copy of host data (or n zero bytes), freed at scope exit.
class Dev {
 public:
  explicit Dev(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(bytes, 16)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0, std::max<size_t>(bytes, 16)), cudaSuccess);
  }
  template <typename T>
  explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
    Upload(v.data());
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void Upload(const void* src) {
    EXPECT_EQ(cudaMemcpy(p_, src, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> v(bytes_ / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), p_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// The step's batch, block tables and weights on the device.
struct DeviceInputs {
  DeviceInputs(const HostCase& h, const Step& step, const Config& c)
      : positions(step.positions),
        seq_of(step.seq_of),
        tables(Flatten(h)),
        q_bias(h.w.q_bias),
        k_bias(h.w.k_bias),
        v_bias(h.w.v_bias),
        q_norm(h.w.q_norm),
        k_norm(h.w.k_norm),
        inv_freq(h.inv_freq) {
    batch.n_tokens = static_cast<int64_t>(step.positions.size());
    batch.positions = positions.as<int32_t>();
    batch.seq_of = seq_of.as<int32_t>();
    batch.block_tables = tables.as<int32_t>();
    batch.max_blocks = h.max_blocks;
    batch.max_position = *std::max_element(step.positions.begin(), step.positions.end());
    dims.n_heads = c.n_heads;
    dims.n_kv_heads = c.n_kv_heads;
    dims.head_dim = c.head_dim;
    dims.sliding_window = c.window;
    dims.norm_eps = h.shape.norm_eps;
    prologue.q_bias = c.bias ? q_bias.as<float>() : nullptr;
    prologue.k_bias = c.bias ? k_bias.as<float>() : nullptr;
    prologue.v_bias = c.bias ? v_bias.as<float>() : nullptr;
    prologue.q_norm = c.qk_norm ? q_norm.as<float>() : nullptr;
    prologue.k_norm = c.qk_norm ? k_norm.as<float>() : nullptr;
    prologue.inv_freq = inv_freq.as<float>();
  }
  // [n_seqs, max_blocks]; -1 past a sequence's blocks (a read there faults).
  static std::vector<int32_t> Flatten(const HostCase& h) {
    std::vector<int32_t> flat(h.tables.size() * static_cast<size_t>(h.max_blocks), -1);
    for (size_t s = 0; s < h.tables.size(); ++s)
      std::copy(h.tables[s].begin(), h.tables[s].end(),
                flat.begin() + static_cast<int64_t>(s) * h.max_blocks);
    return flat;
  }
  cuda::DeviceKvPool Pool(const HostCase& h, const Dev& data) const {
    cuda::DeviceKvPool kv;
    kv.dtype = h.pool.dtype();
    kv.n_layers = kLayers;
    kv.n_blocks = h.pool.n_blocks();
    kv.block_size = kBlockSize;
    kv.n_kv_heads = dims.n_kv_heads;
    kv.head_dim = dims.head_dim;
    kv.data = data.as<void>();
    return kv;
  }

  Dev positions, seq_of, tables, q_bias, k_bias, v_bias, q_norm, k_norm, inv_freq;
  cuda::DeviceBatch batch;
  cuda::AttentionDims dims;
  cuda::QkvPrologue prologue;
};

float PoolElem(const uint8_t* bytes, DType dtype, size_t i) {
  uint16_t h;
  switch (dtype) {
    case DType::kBF16:
      std::memcpy(&h, bytes + 2 * i, 2);
      return Bf16ToF32(h);
    case DType::kF16:
      std::memcpy(&h, bytes + 2 * i, 2);
      return F16ToF32(h);
    default: {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      return f;
    }
  }
}

// Largest |gpu - cpu| / (atol + rtol |cpu|); a result above 1 fails. Reports the first element
// over the bound.
double Compare(const std::vector<float>& gpu, const std::vector<float>& cpu, double atol,
               double rtol, const std::string& what, bool report = true) {
  EXPECT_EQ(gpu.size(), cpu.size()) << what;
  double worst = 0.0;
  bool reported = false;
  for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
    const double err = std::abs(static_cast<double>(gpu[i]) - cpu[i]);
    const double ratio = err / (atol + rtol * std::abs(cpu[i]));
    if (!(ratio <= 1.0) && report && !reported) {
      ADD_FAILURE() << what << ": element " << i << " gpu " << gpu[i] << " cpu " << cpu[i];
      reported = true;
    }
    if (!(ratio <= worst)) worst = ratio;
  }
  return worst;
}

// Calls f(byte offset, bytes) for the K and then the V row of each of the step's tokens in
// kLayer, in token order.
template <typename F>
void ForEachStepRow(const HostCase& h, const Step& step, F&& f) {
  const size_t row_bytes =
      static_cast<size_t>(h.shape.n_kv_heads * h.shape.head_dim) * DTypeSize(h.pool.dtype());
  for (size_t t = 0; t < step.positions.size(); ++t) {
    const int32_t pos = step.positions[t];
    const int64_t block = h.tables[static_cast<size_t>(step.seq_of[t])][pos / kBlockSize];
    for (const uint8_t* plane : {h.pool.keys(block, kLayer), h.pool.values(block, kLayer)})
      f(static_cast<size_t>(plane - h.pool.keys(0, 0)) + (pos % kBlockSize) * row_bytes, row_bytes);
  }
}

// The pool rows of the step's positions (K then V, [T, 2, row]) in kLayer, as floats.
std::vector<float> StepRows(const uint8_t* pool, const HostCase& h, const Step& step) {
  const DType dtype = h.pool.dtype();
  std::vector<float> rows;
  ForEachStepRow(h, step, [&](size_t off, size_t n) {
    for (size_t i = 0; i < n / DTypeSize(dtype); ++i)
      rows.push_back(PoolElem(pool + off, dtype, i));
  });
  return rows;
}

// One case: the prologue and attention on the device from the pool before the step, compared
// with the CPU's; then the attention kernels alone from the CPU's pool and q (with the scratch
// the header asks for, and with none).
void CheckCase(const Config& c, const Step& step, std::mt19937& rng, ThreadPool& threads) {
  SCOPED_TRACE(Name(c) + ", " + step.name);
  const HostCase h = MakeHostCase(c, step, rng, threads);
  DeviceInputs in(h, step, c);
  const int64_t T = in.batch.n_tokens;
  Dev pool(h.before), q(h.q), k(h.k), v(h.v), out(h.cpu_out.size() * sizeof(float));
  const size_t scratch_bytes =
      cuda::PagedAttentionScratchBytes(in.dims, T, in.batch.max_position + 1);
  Dev scratch(scratch_bytes);
  const cuda::DeviceKvPool kv = in.Pool(h, pool);
  cuda::LaunchAttentionPrologue(in.prologue, in.dims, in.batch, kLayer, kv, q.as<float>(),
                                k.as<float>(), v.as<float>(), nullptr);
  cuda::LaunchPagedAttention(in.dims, in.batch, kLayer, kv, q.as<float>(), out.as<float>(),
                             scratch.as<void>(), scratch_bytes, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  Compare(q.Download<float>(), h.cpu_q, kPrologueAtol, kPrologueRtol, "q after the prologue");
  Compare(k.Download<float>(), h.cpu_k, kPrologueAtol, kPrologueRtol, "k after the prologue");
  Compare(v.Download<float>(), h.cpu_v, kPrologueAtol, kPrologueRtol, "v after the prologue");
  const std::vector<uint8_t> gpu_pool = pool.Download<uint8_t>();
  const std::vector<float> gpu_rows = StepRows(gpu_pool.data(), h, step);
  const std::vector<float> cpu_rows = StepRows(h.pool.keys(0, 0), h, step);
  // A 16-bit row element may round the other way when its fp32 value differs in the last bit:
  // one step of the format (2^-7 or 2^-10 relative) apart.
  const double step_rtol = c.dtype == DType::kBF16  ? 0x1p-7
                           : c.dtype == DType::kF16 ? 0x1p-10
                                                    : kPrologueRtol;
  Compare(gpu_rows, cpu_rows, kPrologueAtol + 0x1p-24, step_rtol + kPrologueRtol, "stored rows");
  size_t flips = 0;
  for (size_t i = 0; i < gpu_rows.size(); ++i) flips += gpu_rows[i] != cpu_rows[i];
  // Nothing else in the pool may change: with the step's rows taken from the CPU's pool, the
  // device pool equals it byte for byte.
  const std::vector<uint8_t> after(h.pool.keys(0, 0), h.pool.keys(0, 0) + h.pool.bytes());
  std::vector<uint8_t> outside = gpu_pool;
  ForEachStepRow(h, step, [&](size_t off, size_t n) {
    std::copy_n(after.begin() + static_cast<int64_t>(off), n,
                outside.begin() + static_cast<int64_t>(off));
  });
  EXPECT_TRUE(outside == after) << "the pool changed outside the step's rows";
  const double tol = flips > 0 && c.dtype != DType::kF32 ? kFlipTol : kAttnAtol;
  const double e2e = Compare(out.Download<float>(), h.cpu_out, tol, kAttnRtol, "output");

  // The attention kernels alone, on the CPU's pool and rotated q, into an output of NaNs: every
  // launch, the second on the same scratch too, writes every element.
  pool.Upload(after.data());
  q.Upload(h.cpu_q.data());
  double alone = 0.0;
  for (bool with_scratch : {true, false}) {
    ASSERT_EQ(cudaMemset(out.as<void>(), 0xff, h.cpu_out.size() * sizeof(float)), cudaSuccess);
    cuda::LaunchPagedAttention(in.dims, in.batch, kLayer, kv, q.as<float>(), out.as<float>(),
                               with_scratch ? scratch.as<void>() : nullptr,
                               with_scratch ? scratch_bytes : 0, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    alone = std::max(alone, Compare(out.Download<float>(), h.cpu_out, kAttnAtol, kAttnRtol,
                                    with_scratch ? "attention alone" : "attention, no scratch"));
  }
  std::printf("  %-44s %-28s flips %5zu  error/tol: end-to-end %.3f, kernels %.3f\n",
              Name(c).c_str(), step.name.c_str(), flips, e2e, alone);
}

const Config kConfigs[] = {
    // dtype, head_dim, heads, kv heads, window, qk_norm, bias
    {DType::kF32, 16, 8, 2, 0, true, true},       // the fixtures' shape, group 4
    {DType::kBF16, 8, 4, 2, 0, true, false},      // the smallest head: decode kernel only
    {DType::kF32, 8, 4, 1, 21, false, true},      // group 4, a window
    {DType::kBF16, 16, 8, 8, 37, false, true},    // group 1, a window
    {DType::kF16, 64, 8, 1, 0, true, false},      // group 8
    {DType::kBF16, 128, 32, 4, 0, true, false},   // Qwen3-MoE-like
    {DType::kF32, 128, 8, 2, 100, false, true},   // group 4, a window
    {DType::kF16, 128, 16, 1, 0, true, true},     // group 16: two decode slices
    {DType::kBF16, 64, 12, 2, 300, true, false},  // group 6: partial tiles
    {DType::kF32, 32, 4, 4, 0, true, true},       // group 1
    {DType::kBF16, 256, 8, 2, 0, true, false},    // the largest head
    {DType::kF16, 256, 4, 4, 64, false, true},    // largest head, group 1, a window
    {DType::kF32, 64, 16, 2, 0, false, false},    // group 8, f32
};

TEST(CudaAttention, MatchesCpuAttendOnEveryShapeAndStep) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  ThreadPool threads(4);
  for (const Config& c : kConfigs)
    for (const Step& step : Steps()) CheckCase(c, step, rng, threads);
}

// The comparison is sharp enough to see one key too many: a window one position longer than
// the CPU's fails it.
TEST(CudaAttention, SeesAWindowOnePositionTooLong) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  ThreadPool threads(4);
  const Config c{DType::kF32, 128, 8, 2, 100, false, true};
  for (const Step& step : Steps()) {
    SCOPED_TRACE(step.name);
    const HostCase h = MakeHostCase(c, step, rng, threads);
    DeviceInputs in(h, step, c);
    const std::vector<uint8_t> after(h.pool.keys(0, 0), h.pool.keys(0, 0) + h.pool.bytes());
    Dev pool(after), q(h.cpu_q), out(h.cpu_out.size() * sizeof(float));
    cuda::AttentionDims wider = in.dims;
    wider.sliding_window += 1;
    cuda::LaunchPagedAttention(wider, in.batch, kLayer, in.Pool(h, pool), q.as<float>(),
                               out.as<float>(), nullptr, 0, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_GT(Compare(out.Download<float>(), h.cpu_out, kAttnAtol, kAttnRtol, "", false), 1.0);
  }
}

// An empty step launches nothing and touches nothing.
TEST(CudaAttention, EmptyStepIsANoOp) {
  MT_REQUIRE_GPU();
  cuda::AttentionDims dims{8, 2, 64, 0, 1e-6f};
  cuda::DeviceBatch batch;
  cuda::DeviceKvPool kv;
  cuda::LaunchAttentionPrologue({}, dims, batch, 0, kv, nullptr, nullptr, nullptr, nullptr);
  cuda::LaunchPagedAttention(dims, batch, 0, kv, nullptr, nullptr, nullptr, 0, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Prologue and attention captured in a CUDA graph give the same bits as direct launches.
TEST(CudaAttention, CapturesInACudaGraph) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  ThreadPool threads(4);
  const Config c{DType::kBF16, 128, 32, 4, 0, true, true};
  for (const Step& step : Steps()) {
    SCOPED_TRACE(step.name);
    const HostCase h = MakeHostCase(c, step, rng, threads);
    DeviceInputs in(h, step, c);
    const int64_t T = in.batch.n_tokens;
    const size_t scratch_bytes =
        cuda::PagedAttentionScratchBytes(in.dims, T, in.batch.max_position + 1);
    Dev scratch(scratch_bytes);
    std::vector<float> results[2];
    for (int graph = 0; graph < 2; ++graph) {
      Dev pool(h.before), q(h.q), k(h.k), v(h.v), out(h.cpu_out.size() * sizeof(float));
      const cuda::DeviceKvPool kv = in.Pool(h, pool);
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
      auto launch = [&] {
        cuda::LaunchAttentionPrologue(in.prologue, in.dims, in.batch, kLayer, kv, q.as<float>(),
                                      k.as<float>(), v.as<float>(), stream);
        cuda::LaunchPagedAttention(in.dims, in.batch, kLayer, kv, q.as<float>(), out.as<float>(),
                                   scratch.as<void>(), scratch_bytes, stream);
      };
      if (graph == 1) {
        cudaGraph_t g;
        cudaGraphExec_t exec;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        launch();
        ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
      } else {
        launch();
      }
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
      results[graph] = out.Download<float>();
    }
    EXPECT_EQ(0,
              std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace moetier

namespace moetier {
namespace {

// Timing on a Qwen3-MoE-like layer (32 query heads, 4 key/value heads of 128, bf16 cache); run
// with --gtest_also_run_disabled_tests. Prints the median time and the K/V bytes per second.
TEST(CudaAttention, DISABLED_Timing) {
  MT_REQUIRE_GPU();
  cuda::AttentionDims dims{32, 4, 128, 0, 1e-6f};
  const int64_t B = 16, row = dims.n_kv_heads * dims.head_dim;
  struct Shape {
    const char* name;
    int64_t n_seqs, ctx, chunk;  // chunk tokens per sequence, at positions ctx - chunk ..
  };
  for (const Shape sh :
       {Shape{"decode 1 x 4k", 1, 4096, 1}, Shape{"decode 1 x 32k", 1, 32768, 1},
        Shape{"decode 32 x 4k", 32, 4096, 1}, Shape{"decode 64 x 2k", 64, 2048, 1},
        Shape{"prefill 4096 from 0", 1, 4096, 4096}, Shape{"prefill 512 at 8k", 1, 8192, 512}}) {
    const int64_t blocks_per_seq = (sh.ctx + B - 1) / B;
    const int64_t n_blocks = blocks_per_seq * sh.n_seqs;
    Dev pool(static_cast<size_t>(n_blocks * 2 * B * row * 2));
    cudaMemset(pool.as<void>(), 0x3c, static_cast<size_t>(n_blocks * 2 * B * row * 2));
    std::vector<int32_t> tables(static_cast<size_t>(n_blocks)), pos, seq;
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(1));
    for (int64_t s = 0; s < sh.n_seqs; ++s)
      for (int64_t i = sh.ctx - sh.chunk; i < sh.ctx; ++i) {
        pos.push_back(static_cast<int32_t>(i));
        seq.push_back(static_cast<int32_t>(s));
      }
    const int64_t T = static_cast<int64_t>(pos.size());
    Dev d_tables(tables), d_pos(pos), d_seq(seq);
    Dev q(static_cast<size_t>(T * dims.n_heads * dims.head_dim * 4)),
        out(q.Download<uint8_t>().size());
    cuda::DeviceKvPool kv{DType::kBF16,   1, n_blocks, B, dims.n_kv_heads, dims.head_dim,
                          pool.as<void>()};
    cuda::DeviceBatch batch{T,
                            d_pos.as<int32_t>(),
                            d_seq.as<int32_t>(),
                            d_tables.as<int32_t>(),
                            blocks_per_seq,
                            static_cast<int32_t>(sh.ctx - 1)};
    const size_t scratch_bytes = cuda::PagedAttentionScratchBytes(dims, T, sh.ctx);
    Dev scratch(scratch_bytes);
    const double sec =
        testing::MedianGpuMs([&] {
          cuda::LaunchPagedAttention(dims, batch, 0, kv, q.as<float>(), out.as<float>(),
                                     scratch.as<void>(), scratch_bytes, nullptr);
        }) *
        1e-3;
    const double kv_bytes = static_cast<double>(sh.n_seqs * sh.ctx * row * 2 * 2);
    const double flops = 4.0 * dims.n_heads * dims.head_dim * sh.n_seqs *
                         (sh.chunk * (sh.ctx - sh.chunk) + sh.chunk * (sh.chunk + 1) / 2.0);
    std::printf("  %-22s T %5lld  %9.1f us  %7.1f GB/s  %6.2f TFLOP/s\n", sh.name,
                static_cast<long long>(T), sec * 1e6, kv_bytes / sec * 1e-9, flops / sec * 1e-12);
  }
}

}  // namespace
}  // namespace moetier
