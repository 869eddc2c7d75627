// Every instruction-set level this CPU can run, for every weight format, against the scalar
// reference, and the scalar reference against a double-precision dot, on fresh random inputs:
// odd row counts, k with and without tails, several token counts. Also: results that must be
// bit-identical (row splits, thread counts, token batching) and activation preparation that
// must match the scalar quantizer bit for bit.
//
// Tolerances (u = 2^-24, the float32 unit roundoff; P = sum over j of |w_j * x_j| for the
// operands the kernel multiplies):
//  - scalar vs double: the scalar kernels accumulate in double and round once, so
//    |y - ref| <= u |ref| + k 2^-52 P.
//  - SIMD vs scalar (fp32 math): each of L >= 8 lanes accumulates k/L products with one
//    rounding per FMA, then a log2(L)-level tree: |y - ref| <= (k/L + log2 L + 1) u P, so we
//    allow (k/8 + 16) u P.
//  - SIMD vs scalar (quantized): integer block dots are exact; each block adds one scale
//    product and one FMA rounding per lane: (k/32 + 16) u P, P over dequantized operands.
//  - quantized vs the unquantized activations: |x - dx q| <= dx/2 per element (round to
//    nearest; 1.001 for the rounding of x * 127/amax), so |y - w.x| <= sum_j |w_j| 0.501 dx_b.
//  - bf16 activations (kAvx512Bf16, bf16 weights): x rounded to nearest bf16 (8-bit
//    significand: relative error <= 2^-8), products then exact, so |y - ref| <= 2^-8 P +
//    (k/16 + 16) u P.
//  - AMX tiles (kAmx, packed batches): Q8_0 adds block after block in one fp32 chain, k/32
//    steps as above. BF16 splits x exactly into three bf16 parts (3k exact products) that the
//    tile adds into one fp32 accumulator, at most one rounding per product: (3k + 16) u P.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "support/seed.h"

namespace moetier::kernels {
namespace {

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // exactly what the bytes hold, as float32
  TensorView view;
};

enum class Fill { kNormal, kRandomBytes };

Weights MakeWeights(DType dt, int64_t rows, int64_t k, std::mt19937& rng, Fill fill) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Weights w;
  const size_t row_bytes = DTypeRowBytes(dt, k);
  w.bytes.resize(row_bytes * static_cast<size_t>(rows) + 1);  // +1: never empty
  w.values.resize(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * row_bytes;
    float* vals = w.values.data() + r * k;
    std::vector<float> src(static_cast<size_t>(k));
    for (float& v : src) v = dist(rng);
    if (fill == Fill::kRandomBytes && IsBlockQuantized(dt)) {
      // Every code a GGUF file may hold (Q8_0's -128 included), scales of either sign.
      for (size_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(rng());
      for (size_t b = 0; b < row_bytes; b += DTypeBlockBytes(dt)) {
        const uint16_t h = F32ToF16(dist(rng) * 0.01f);
        std::memcpy(row + b, &h, 2);
      }
      if (dt == DType::kQ8_0) {
        DequantizeRowQ8_0(row, k, vals);
      } else {
        DequantizeRowQ4_0(row, k, vals);
      }
      continue;
    }
    switch (dt) {
      case DType::kF32:
        std::memcpy(row, src.data(), row_bytes);
        std::memcpy(vals, src.data(), row_bytes);
        break;
      case DType::kBF16:
      case DType::kF16:
        for (int64_t i = 0; i < k; ++i) {
          const uint16_t h = dt == DType::kBF16 ? F32ToBf16(src[i]) : F32ToF16(src[i]);
          std::memcpy(row + 2 * i, &h, 2);
          vals[i] = dt == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
        }
        break;
      case DType::kQ8_0:
        QuantizeRowQ8_0(src.data(), k, row);
        DequantizeRowQ8_0(row, k, vals);
        break;
      case DType::kQ4_0:
        QuantizeRowQ4_0(src.data(), k, row);
        DequantizeRowQ4_0(row, k, vals);
        break;
      case DType::kBF16C: {
        // kRandomBytes: up to 12 exceptions a row (zeros, bf16 subnormals, tiny and large
        // outliers), in random places, so the kernels' patching is exercised.
        if (fill == Fill::kRandomBytes) {
          const float odd[] = {0.0f, -0.0f, 1e-39f, -3e-40f, 0x1p-60f, -0x1p-50f, 0x1p12f, -0x1p9f};
          const int n = static_cast<int>(rng() % 13);
          for (int e = 0; e < n; ++e) src[rng() % static_cast<size_t>(k)] = odd[rng() % 8];
        }
        std::vector<uint16_t> bits(static_cast<size_t>(k));
        for (int64_t i = 0; i < k; ++i) {
          bits[i] = F32ToBf16(src[i]);
          vals[i] = Bf16ToF32(bits[i]);
        }
        EXPECT_GE(PackRowBf16c(bits.data(), k, row), 0);
        break;
      }
      default:
        break;
    }
  }
  w.view = TensorView{dt, {rows, k}, w.bytes.data(), row_bytes * static_cast<size_t>(rows)};
  return w;
}

std::vector<float> RandomActivations(int64_t n_tokens, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * k));
  for (float& v : x) v = dist(rng);
  if (k >= 64) {  // an all-zero block and a loud one: the quantizer's edge cases
    for (int64_t j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = 0.0f;
    x[static_cast<size_t>(40)] = 1000.0f;
  }
  return x;
}

// Element i of token t of quantized prepared activations: (quant, block scale), whatever the
// layout (natural, or nibble-interleaved groups, with per-element or summed lanes; see
// matmul_isa.h).
std::pair<int, float> QuantAt(const PreparedActivations& p, int64_t t, int64_t i) {
  const isa::QuantLayout lay = isa::QuantLayoutFor(p.k(), p.view().group, p.view().run);
  const uint8_t* rec = p.view().data + t * p.view().token_bytes;
  const auto* qx = reinterpret_cast<const int8_t*>(rec);
  const auto* dx = reinterpret_cast<const float*>(rec + lay.dx_offset);
  const int64_t b = i / 32, e = i % 32, G = lay.group;
  int64_t at = i;
  if (G > 1) {
    const int64_t base = (b / G) * G * 32, j = b % G;
    at = e < 16 ? base + 16 * j + e : base + 16 * (G + j) + (e - 16);
  }
  return {qx[at], dx[isa::FirstLaneOfBlock(lay, b)]};
}

// The activations as the kernel multiplies them: x itself, or dequantized q8 blocks.
std::vector<double> EffectiveActivations(const PreparedActivations& p, const float* x) {
  const int64_t T = p.n_tokens(), k = p.k();
  std::vector<double> out(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < k; ++i) {
      if (!IsBlockQuantized(p.w_dtype())) {
        out[static_cast<size_t>(t * k + i)] = x[t * k + i];
      } else {
        const auto [q, d] = QuantAt(p, t, i);
        out[static_cast<size_t>(t * k + i)] = static_cast<double>(d) * q;
      }
    }
  return out;
}

std::vector<float> RunDot(CpuIsa cpu_isa, const Weights& w, const std::vector<float>& x,
                          int64_t n_tokens, PreparedActivations* keep = nullptr) {
  const int64_t rows = w.view.shape[0], k = w.view.shape[1];
  PreparedActivations local;
  PreparedActivations& p = keep ? *keep : local;
  p.Prepare(x.data(), n_tokens, k, w.view.dtype, cpu_isa);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);
  DotRows(w.view, 0, rows, p, y.data(), rows);
  return y;
}

struct Shape {
  int64_t rows, k, tokens;
};

std::vector<Shape> ShapesFor(DType dt) {
  if (IsBlockFormat(dt))
    return {{1, 32, 1},  {3, 64, 1},  {5, 96, 2},     {13, 160, 3}, {7, 2048, 1}, {67, 256, 5},
            {9, 768, 4}, {6, 320, 9}, {17, 1024, 16}, {2, 32, 33},  {35, 512, 20}};
  // Rows past 32 and tokens past 16: several AMX row blocks and token tiles, partial ones.
  return {{1, 1, 1},    {3, 7, 1},     {5, 8, 2},    {13, 15, 3}, {7, 16, 1},   {2, 17, 5},
          {11, 31, 4},  {6, 33, 9},    {67, 100, 1}, {5, 257, 6}, {9, 1024, 3}, {4, 2048, 1},
          {3, 768, 16}, {17, 129, 33}, {35, 96, 19}, {50, 512, 2}};
}

// The kernel dtype preparing n tokens of weights dt on cpu_isa gives (PreparedActivations).
DType KernelDTypeOfOneBatch(DType dt, CpuIsa cpu_isa, int64_t n) {
  PreparedActivations p;
  const std::vector<float> x(static_cast<size_t>(n * 32), 1.0f);
  p.Prepare(x.data(), n, 32, dt, cpu_isa);
  return p.kernel_dtype();
}

// Which levels to test: every one this CPU runs.
std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : kAllCpuIsas)
    if (CpuSupports(isa)) v.push_back(isa);
  return v;
}

constexpr double kU = 0x1p-24;

class FormatTest : public ::testing::TestWithParam<DType> {};

TEST_P(FormatTest, ScalarMatchesDoubleDot) {
  std::mt19937 rng(testing::TestSeed());
  const DType dt = GetParam();
  for (const Shape& s : ShapesFor(dt)) {
    const Weights w = MakeWeights(dt, s.rows, s.k, rng, Fill::kNormal);
    const std::vector<float> x = RandomActivations(s.tokens, s.k, rng);
    PreparedActivations p;
    const std::vector<float> y = RunDot(CpuIsa::kScalar, w, x, s.tokens, &p);
    const std::vector<double> xe = EffectiveActivations(p, x.data());
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t r = 0; r < s.rows; ++r) {
        double ref = 0.0, mag = 0.0, qerr = 0.0, exact = 0.0;
        for (int64_t i = 0; i < s.k; ++i) {
          const double wv = w.values[static_cast<size_t>(r * s.k + i)];
          const double p_i = wv * xe[static_cast<size_t>(t * s.k + i)];
          ref += p_i;
          mag += std::fabs(p_i);
          exact += wv * x[static_cast<size_t>(t * s.k + i)];
          if (IsBlockQuantized(dt)) {
            const int64_t b = i / 32;
            double amax = 0.0;
            for (int64_t j = 0; j < 32; ++j)
              amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(t * s.k + b * 32 + j)]));
            qerr += std::fabs(wv) * 0.501 * amax / 127.0;
          }
        }
        const float got = y[static_cast<size_t>(t * s.rows + r)];
        ASSERT_NEAR(got, ref, kU * std::fabs(ref) + s.k * 0x1p-52 * mag + 1e-30)
            << DTypeName(dt) << " rows " << s.rows << " k " << s.k << " t " << t << " r " << r;
        if (IsBlockQuantized(dt)) {  // and against the activations before quantization
          ASSERT_NEAR(got, exact, qerr + 4 * kU * mag + 1e-30)
              << DTypeName(dt) << " k " << s.k << " t " << t << " r " << r;
        }
      }
  }
}

TEST_P(FormatTest, EveryIsaMatchesScalar) {
  std::mt19937 rng(testing::TestSeed());
  const DType dt = GetParam();
  for (CpuIsa cpu_isa : SupportedIsas()) {
    if (cpu_isa == CpuIsa::kScalar) continue;
    for (Fill fill : {Fill::kNormal, Fill::kRandomBytes}) {
      for (const Shape& s : ShapesFor(dt)) {
        const Weights w = MakeWeights(dt, s.rows, s.k, rng, fill);
        const std::vector<float> x = RandomActivations(s.tokens, s.k, rng);
        PreparedActivations ps;
        const std::vector<float> ref = RunDot(CpuIsa::kScalar, w, x, s.tokens, &ps);
        PreparedActivations pg;
        const std::vector<float> got = RunDot(cpu_isa, w, x, s.tokens, &pg);
        const std::vector<double> xe = EffectiveActivations(ps, x.data());
        // BF16C batches may run the level's bf16 kernels on expanded rows (kernel_dtype()).
        const bool amx_bf16 = pg.view().packed != nullptr && pg.kernel_dtype() == DType::kBF16;
        const bool bf16_acts = cpu_isa == CpuIsa::kAvx512Bf16 && pg.kernel_dtype() == DType::kBF16;
        const double steps = IsBlockQuantized(dt) ? s.k / 32.0 : amx_bf16 ? 3.0 * s.k : s.k / 8.0;
        for (int64_t t = 0; t < s.tokens; ++t)
          for (int64_t r = 0; r < s.rows; ++r) {
            double mag = 0.0;
            for (int64_t i = 0; i < s.k; ++i)
              mag += std::fabs(w.values[static_cast<size_t>(r * s.k + i)] *
                               xe[static_cast<size_t>(t * s.k + i)]);
            const double tol = (bf16_acts ? 0x1p-8 * mag : 0.0) + (steps + 16) * kU * mag + 1e-30;
            const size_t at = static_cast<size_t>(t * s.rows + r);
            ASSERT_NEAR(got[at], ref[at], tol)
                << CpuIsaName(cpu_isa) << " " << DTypeName(dt) << " rows " << s.rows << " k " << s.k
                << " tokens " << s.tokens << " t " << t << " r " << r;
          }
      }
    }
  }
}

// Row splits, thread counts and batching leave every bit alone (k: with a tail, and for the
// float formats also a multiple of 32, which the amx level runs on tiles).
void CheckSplitsThreadsAndBatching(DType dt, int64_t k, std::mt19937& rng) {
  const int64_t rows = 29, tokens = 11;
  const Weights w = MakeWeights(dt, rows, k, rng, Fill::kNormal);
  const std::vector<float> x = RandomActivations(tokens, k, rng);
  for (CpuIsa cpu_isa : SupportedIsas()) {
    PreparedActivations p;
    const std::vector<float> whole = RunDot(cpu_isa, w, x, tokens, &p);
    // Row ranges of every alignment.
    std::vector<float> split(whole.size(), NAN);
    for (int64_t a = 0; a < rows;) {
      const int64_t b = std::min<int64_t>(rows, a + 1 + a % 6);
      DotRows(w.view, a, b, p, split.data(), rows);
      a = b;
    }
    ASSERT_EQ(0, std::memcmp(whole.data(), split.data(), whole.size() * sizeof(float)))
        << CpuIsaName(cpu_isa) << " " << DTypeName(dt);
    const DType kdt = p.kernel_dtype();  // BF16C batches: kBF16 on levels with bf16 dots
    if (cpu_isa == CpuIsa::kAmx && (kdt == DType::kQ8_0 || kdt == DType::kBF16)) {
      // The tile path really ran, and batches it packs agree bit for bit however they are cut.
      ASSERT_EQ(p.view().packed != nullptr, k % 32 == 0);
      ASSERT_LE(PackMinTokens(), 5);
      for (int64_t first : {0, 5}) {
        const int64_t n = first == 0 ? 5 : tokens - 5;
        const std::vector<float> part(x.begin() + first * k, x.begin() + (first + n) * k);
        const std::vector<float> yp = RunDot(cpu_isa, w, part, n);
        ASSERT_EQ(0, std::memcmp(yp.data(), whole.data() + first * rows, yp.size() * sizeof(float)))
            << DTypeName(dt) << " tokens from " << first;
      }
      if (PackMinTokens() > 1) continue;  // single tokens take the unpacked path
    }
    // BF16C batches expanded for bf16 kernels: single tokens stream the packed rows through
    // the AVX2 kernels instead (matmul.h, Bf16cExpandMinTokens), which sum in another order.
    if (kdt != dt) continue;
    // One token at a time (decode) gives what the batch (prefill) gave.
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> one(x.begin() + t * k, x.begin() + (t + 1) * k);
      const std::vector<float> y1 = RunDot(cpu_isa, w, one, 1);
      ASSERT_EQ(0, std::memcmp(y1.data(), whole.data() + t * rows, rows * sizeof(float)))
          << CpuIsaName(cpu_isa) << " " << DTypeName(dt) << " token " << t;
    }
    // Decode over row ranges of every length and alignment (its results leave in groups of 8
    // or 16 rows from a register): the same bits, and nothing written outside the range.
    PreparedActivations p1;
    p1.Prepare(x.data(), 1, k, dt, cpu_isa);
    for (int64_t a = 0; a < rows; ++a)
      for (int64_t b :
           {a + 1, std::min<int64_t>(rows, a + 9), std::min<int64_t>(rows, a + 17), rows}) {
        std::vector<float> y(static_cast<size_t>(rows), NAN);
        DotRows(w.view, a, b, p1, y.data(), rows);
        for (int64_t r = 0; r < rows; ++r) {
          if (r < a || r >= b) {
            ASSERT_TRUE(std::isnan(y[static_cast<size_t>(r)]))
                << CpuIsaName(cpu_isa) << " " << DTypeName(dt) << " rows [" << a << ", " << b
                << ") wrote row " << r;
          } else {
            ASSERT_EQ(0, std::memcmp(&y[static_cast<size_t>(r)], &whole[static_cast<size_t>(r)],
                                     sizeof(float)))
                << CpuIsaName(cpu_isa) << " " << DTypeName(dt) << " rows [" << a << ", " << b
                << ") row " << r;
          }
        }
      }
  }
  // MatMul (the active ISA) with 1, 2 and 3 threads.
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> y(static_cast<size_t>(tokens * rows), NAN);
    MatMul(pool, x.data(), tokens, w.view, y.data());
    if (first.empty()) {
      first = y;
      const std::vector<float> direct = RunDot(ActiveCpuIsa(), w, x, tokens);
      ASSERT_EQ(0, std::memcmp(direct.data(), y.data(), y.size() * sizeof(float)));
    } else {
      ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float))) << threads;
    }
  }
  // MatMulRows over two halves matches MatMul.
  std::vector<float> halves(first.size(), NAN);
  MatMulRows(x.data(), tokens, w.view, 0, 13, halves.data(), rows);
  MatMulRows(x.data(), tokens, w.view, 13, rows, halves.data(), rows);
  ASSERT_EQ(0, std::memcmp(first.data(), halves.data(), first.size() * sizeof(float)));
}

TEST_P(FormatTest, ResultsDoNotDependOnSplitsThreadsOrBatching) {
  std::mt19937 rng(testing::TestSeed());
  const DType dt = GetParam();
  for (int64_t k : IsBlockFormat(dt) ? std::vector<int64_t>{160} : std::vector<int64_t>{75, 96}) {
    SCOPED_TRACE("k " + std::to_string(k));
    CheckSplitsThreadsAndBatching(dt, k, rng);
    if (HasFatalFailure()) return;
  }
}

// Gather (the MoE executor's per-expert copy of a chunk's prepared tokens) gives what preparing
// the gathered float rows gives, tile packing included.
TEST_P(FormatTest, GatherEqualsPreparingTheGatheredRows) {
  std::mt19937 rng(testing::TestSeed());
  const DType dt = GetParam();
  const int64_t rows = 21, k = IsBlockFormat(dt) ? 96 : 64, tokens = 11;
  const Weights w = MakeWeights(dt, rows, k, rng, Fill::kNormal);
  const std::vector<float> x = RandomActivations(tokens, k, rng);
  const std::vector<int32_t> pick = {3, 7, 1, 9, 0, 10};
  std::vector<float> xg;
  for (int32_t t : pick) xg.insert(xg.end(), x.begin() + t * k, x.begin() + (t + 1) * k);
  for (CpuIsa cpu_isa : SupportedIsas()) {
    PreparedActivations all, gathered;
    all.Prepare(x.data(), tokens, k, dt, cpu_isa);
    for (int64_t n : {int64_t{1}, static_cast<int64_t>(pick.size())}) {
      gathered.Gather(all, pick.data(), n);
      std::vector<float> y(static_cast<size_t>(n * rows), NAN);
      DotRows(w.view, 0, rows, gathered, y.data(), rows);
      // A gather keeps its source's kernel dtype: a lone BF16C token gathered from a batch that
      // expands rows for bf16 kernels is not what preparing one token gives (matmul.h).
      if (gathered.kernel_dtype() != KernelDTypeOfOneBatch(dt, cpu_isa, n)) continue;
      const std::vector<float> want = RunDot(cpu_isa, w, {xg.begin(), xg.begin() + n * k}, n);
      ASSERT_EQ(0, std::memcmp(want.data(), y.data(), y.size() * sizeof(float)))
          << CpuIsaName(cpu_isa) << " " << DTypeName(dt) << " n " << n;
    }
  }
}

// Prepare spread over a pool (one task per 16 tokens) writes what the serial Prepare writes.
TEST_P(FormatTest, PoolPrepareEqualsSerialPrepare) {
  std::mt19937 rng(testing::TestSeed());
  const DType dt = GetParam();
  const int64_t rows = 19, k = IsBlockFormat(dt) ? 128 : 96;
  const int64_t tokens = std::max<int64_t>(ParallelPrepareTokens(), 32) + 9;  // a partial tile
  const Weights w = MakeWeights(dt, rows, k, rng, Fill::kNormal);
  const std::vector<float> x = RandomActivations(tokens, k, rng);
  ThreadPool pool(3);
  for (CpuIsa cpu_isa : SupportedIsas()) {
    PreparedActivations serial, spread;
    serial.Prepare(x.data(), tokens, k, dt, cpu_isa);
    spread.Prepare(pool, x.data(), tokens, k, dt, cpu_isa);
    const isa::Prepared &a = serial.view(), &b = spread.view();
    ASSERT_EQ(a.token_bytes, b.token_bytes);
    ASSERT_EQ(a.packed == nullptr, b.packed == nullptr);
    if (a.token_bytes > 0) {
      ASSERT_EQ(0, std::memcmp(a.data, b.data, static_cast<size_t>(a.token_bytes * tokens)))
          << CpuIsaName(cpu_isa) << " " << DTypeName(dt);
    }
    std::vector<float> ya(static_cast<size_t>(tokens * rows), NAN), yb = ya;
    DotRows(w.view, 0, rows, serial, ya.data(), rows);
    DotRows(w.view, 0, rows, spread, yb.data(), rows);
    ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)))
        << CpuIsaName(cpu_isa) << " " << DTypeName(dt);
  }
}

// The AVX-512 levels' fp32 kernels sum in the AVX2 level's order (matmul_avx512_impl.h,
// HSumAvx2Order): f32, bf16 and f16 weights give the same bits on both, for every shape, tail
// and token count (one token, and batches that take the converted-row tiles).
TEST(FloatKernels, Avx512LevelsEqualAvx2BitForBit) {
  if (!CpuSupports(CpuIsa::kAvx512)) {
    std::printf("[  SKIPPED ] no avx512 here\n");
    return;
  }
  std::mt19937 rng(testing::TestSeed());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& s : ShapesFor(dt)) {
      const Weights w = MakeWeights(dt, s.rows, s.k, rng, Fill::kNormal);
      const std::vector<float> x = RandomActivations(std::max<int64_t>(s.tokens, 5), s.k, rng);
      for (int64_t tokens : {int64_t{1}, s.tokens, int64_t{5}}) {
        const std::vector<float> want = RunDot(CpuIsa::kAvx2, w, x, tokens);
        for (CpuIsa cpu_isa : {CpuIsa::kAvx512, CpuIsa::kAvx512Vnni}) {
          if (!CpuSupports(cpu_isa)) continue;
          const std::vector<float> got = RunDot(cpu_isa, w, x, tokens);
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << CpuIsaName(cpu_isa) << " " << DTypeName(dt) << " rows " << s.rows << " k " << s.k
              << " tokens " << tokens;
        }
      }
    }
  }
}

// A float-format batch reads its rows converted to float32 once or converted in registers
// tile by tile, BF16C rows expanded to bf16 first (Prepared::convert_batch_rows, chosen per CPU
// by ConvertBatchRows): both give the same bits, which are each token's own alone.
TEST(FloatKernels, BatchRowsConvertedOnceOrInRegistersAgree) {
  std::mt19937 rng(testing::TestSeed());
  for (CpuIsa cpu_isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Vnni}) {
    if (!CpuSupports(cpu_isa)) continue;
    for (DType dt : {DType::kBF16, DType::kF16, DType::kBF16C}) {
      for (const Shape& s : ShapesFor(dt)) {
        if (dt == DType::kBF16C && s.k % 32 != 0) continue;
        const int64_t tokens = std::max<int64_t>(s.tokens, Bf16cExpandMinTokens()) + 1;
        const Weights w = MakeWeights(dt, s.rows, s.k, rng,
                                      dt == DType::kBF16C ? Fill::kRandomBytes : Fill::kNormal);
        const std::vector<float> x = RandomActivations(tokens, s.k, rng);
        PreparedActivations p;
        p.Prepare(x.data(), tokens, s.k, dt, cpu_isa);
        ASSERT_EQ(p.kernel_dtype(), dt);
        const size_t row_bytes = DTypeRowBytes(dt, s.k);
        const isa::WFormat format = dt == DType::kBF16  ? isa::WFormat::kBF16
                                    : dt == DType::kF16 ? isa::WFormat::kF16
                                                        : isa::WFormat::kBF16C;
        std::vector<float> scratch(static_cast<size_t>(isa::ScratchFloats(s.k)) + 16);
        float* aligned = reinterpret_cast<float*>(
            isa::RoundUp(reinterpret_cast<intptr_t>(scratch.data()), isa::kAlign));
        std::vector<float> y[2];
        for (bool convert : {true, false}) {
          isa::Prepared v = p.view();
          v.convert_batch_rows = convert;
          std::vector<float>& out = y[convert ? 1 : 0];
          out.assign(static_cast<size_t>(tokens * s.rows), NAN);
          SafeKernels(p.isa()).dot_rows(format, w.bytes.data(), static_cast<int64_t>(row_bytes), 0,
                                        s.rows, v, out.data(), s.rows, aligned);
        }
        const std::string at = std::string(CpuIsaName(p.isa())) + " " + std::string(DTypeName(dt)) +
                               " rows " + std::to_string(s.rows) + " k " + std::to_string(s.k) +
                               " tokens " + std::to_string(tokens);
        ASSERT_EQ(0, std::memcmp(y[0].data(), y[1].data(), y[0].size() * sizeof(float))) << at;
        for (int64_t t = 0; t < tokens; ++t) {
          const std::vector<float> xt(x.begin() + t * s.k, x.begin() + (t + 1) * s.k);
          const std::vector<float> one = RunDot(cpu_isa, w, xt, 1);
          ASSERT_EQ(0,
                    std::memcmp(one.data(), y[0].data() + t * s.rows, one.size() * sizeof(float)))
              << at << " token " << t;
        }
      }
    }
  }
}

// On kAvx512 / kAvx512Vnni, BF16C batches run that level's fp32 tiles on decoded rows and one
// token the AVX2 BF16C kernel: a token's results are the same bits either way.
TEST(Bf16cKernels, Avx512BatchesEqualOneTokenAtATime) {
  std::mt19937 rng(testing::TestSeed());
  bool ran = false;
  for (CpuIsa cpu_isa : {CpuIsa::kAvx512, CpuIsa::kAvx512Vnni}) {
    if (!CpuSupports(cpu_isa)) continue;
    ran = true;
    for (const Shape& s : ShapesFor(DType::kBF16C)) {
      const int64_t tokens = std::max<int64_t>(s.tokens, Bf16cExpandMinTokens());
      const Weights c = MakeWeights(DType::kBF16C, s.rows, s.k, rng, Fill::kRandomBytes);
      const std::vector<float> x = RandomActivations(tokens, s.k, rng);
      PreparedActivations p;
      const std::vector<float> batch = RunDot(cpu_isa, c, x, tokens, &p);
      ASSERT_EQ(p.isa(), cpu_isa);
      for (int64_t t = 0; t < tokens; ++t) {
        const std::vector<float> xt(x.begin() + t * s.k, x.begin() + (t + 1) * s.k);
        const std::vector<float> one = RunDot(cpu_isa, c, xt, 1);
        ASSERT_EQ(0, std::memcmp(one.data(), batch.data() + t * s.rows, one.size() * sizeof(float)))
            << CpuIsaName(cpu_isa) << " rows " << s.rows << " k " << s.k << " token " << t;
      }
    }
  }
  if (!ran) std::printf("[  SKIPPED ] no avx512 level here\n");
}

// BF16C batches on levels with bf16 dot instructions expand rows for the bf16 kernels; there
// they give exactly plain bf16's results (same rows, same kernels).
TEST(Bf16cKernels, ExpandedBatchesEqualBf16) {
  std::mt19937 rng(testing::TestSeed());
  bool ran = false;
  for (CpuIsa cpu_isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAmx}) {
    if (!CpuSupports(cpu_isa)) continue;
    ran = true;
    for (const Shape& s : ShapesFor(DType::kBF16C)) {
      const int64_t tokens = std::max<int64_t>(s.tokens, Bf16cExpandMinTokens());
      const Weights c = MakeWeights(DType::kBF16C, s.rows, s.k, rng, Fill::kRandomBytes);
      Weights b;
      b.bytes.resize(static_cast<size_t>(s.rows * s.k) * 2 + 1);
      for (size_t i = 0; i < c.values.size(); ++i) {
        const uint16_t h = F32ToBf16(c.values[i]);
        std::memcpy(b.bytes.data() + 2 * i, &h, 2);
      }
      b.view = TensorView{DType::kBF16, {s.rows, s.k}, b.bytes.data(), b.bytes.size() - 1};
      const std::vector<float> x = RandomActivations(tokens, s.k, rng);
      PreparedActivations p;
      const std::vector<float> yc = RunDot(cpu_isa, c, x, tokens, &p);
      ASSERT_EQ(p.kernel_dtype(), DType::kBF16);
      const std::vector<float> yb = RunDot(cpu_isa, b, x, tokens);
      ASSERT_EQ(0, std::memcmp(yc.data(), yb.data(), yc.size() * sizeof(float)))
          << CpuIsaName(cpu_isa) << " rows " << s.rows << " k " << s.k << " tokens " << tokens;
    }
  }
  if (!ran) std::printf("[  SKIPPED ] no avx512bf16 or amx level here\n");
}

// The AVX2 expansion of BF16C rows to bf16 (what the bf16-dot levels' batches read) is the
// exact unpacking, exceptions included.
TEST(Bf16cKernels, Avx2ExpansionEqualsUnpacking) {
  if (!CpuSupports(CpuIsa::kAvx2)) {
    std::printf("[  SKIPPED ] no avx2 here\n");
    return;
  }
  std::mt19937 rng(testing::TestSeed());
  for (const Shape& s : ShapesFor(DType::kBF16C)) {
    const Weights c = MakeWeights(DType::kBF16C, s.rows, s.k, rng, Fill::kRandomBytes);
    const size_t row_bytes = DTypeRowBytes(DType::kBF16C, s.k);
    std::vector<uint16_t> got(static_cast<size_t>(s.rows * s.k)), want(got.size());
    // Prefetching ahead of the rows (stopped at their end) changes nothing but timing.
    const auto end = reinterpret_cast<uintptr_t>(c.bytes.data() + s.rows * row_bytes);
    isa::Avx2ExpandBf16cRows(c.bytes.data(), static_cast<int64_t>(row_bytes), s.rows, s.k,
                             got.data(), /*ahead=*/512, end);
    for (int64_t r = 0; r < s.rows; ++r)
      UnpackRowBf16c(c.bytes.data() + r * row_bytes, s.k, want.data() + r * s.k);
    ASSERT_EQ(got, want) << "rows " << s.rows << " k " << s.k;
  }
}

// BF16C holds bf16's values in fewer bytes, and its kernels do bf16's arithmetic: on the scalar
// and AVX2 levels (the ones that run it) its results equal plain bf16's bit for bit, decode and
// prefill, with and without exceptions.
TEST(Bf16cKernels, EqualBf16BitForBit) {
  std::mt19937 rng(testing::TestSeed());
  for (CpuIsa cpu_isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
    if (!CpuSupports(cpu_isa)) {
      std::printf("[  SKIPPED ] %s: not supported here\n",
                  std::string(CpuIsaName(cpu_isa)).c_str());
      continue;
    }
    for (const Shape& s : ShapesFor(DType::kBF16C)) {
      for (Fill fill : {Fill::kNormal, Fill::kRandomBytes}) {
        const Weights c = MakeWeights(DType::kBF16C, s.rows, s.k, rng, fill);
        // The same values as plain bf16.
        Weights b;
        b.bytes.resize(static_cast<size_t>(s.rows * s.k) * 2 + 1);
        for (size_t i = 0; i < c.values.size(); ++i) {
          const uint16_t h = F32ToBf16(c.values[i]);
          ASSERT_EQ(Bf16ToF32(h), c.values[i]);
          std::memcpy(b.bytes.data() + 2 * i, &h, 2);
        }
        b.view = TensorView{DType::kBF16, {s.rows, s.k}, b.bytes.data(), b.bytes.size() - 1};
        const std::vector<float> x = RandomActivations(s.tokens, s.k, rng);
        for (int64_t tokens : {int64_t{1}, s.tokens}) {
          const std::vector<float> yc = RunDot(cpu_isa, c, x, tokens);
          const std::vector<float> yb = RunDot(cpu_isa, b, x, tokens);
          ASSERT_EQ(0, std::memcmp(yc.data(), yb.data(), yc.size() * sizeof(float)))
              << CpuIsaName(cpu_isa) << " rows " << s.rows << " k " << s.k << " tokens " << tokens;
        }
      }
    }
  }
}

// Every SIMD level asked for BF16C with one token hands it to the AVX2 kernels (its slot order
// is theirs); so does a gathered copy of fewer tokens than Bf16cExpandMinTokens.
TEST(Bf16cKernels, SimdLevelsRunTheAvx2Kernels) {
  std::mt19937 rng(testing::TestSeed());
  const int64_t batch = Bf16cExpandMinTokens();
  const std::vector<float> x = RandomActivations(batch, 64, rng);
  const int32_t first[1] = {0};
  for (CpuIsa cpu_isa : SupportedIsas()) {
    const CpuIsa want = cpu_isa == CpuIsa::kScalar ? CpuIsa::kScalar : CpuIsa::kAvx2;
    PreparedActivations p;
    p.Prepare(x.data(), 1, 64, DType::kBF16C, cpu_isa);
    EXPECT_EQ(p.isa(), want) << CpuIsaName(cpu_isa);
    PreparedActivations all, one;
    all.Prepare(x.data(), batch, 64, DType::kBF16C, cpu_isa);
    one.Gather(all, first, 1);
    if (all.kernel_dtype() == DType::kBF16C) {
      EXPECT_EQ(one.isa(), want) << CpuIsaName(cpu_isa);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FormatTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0,
                                           DType::kQ4_0, DType::kBF16C),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Every level quantizes activations exactly as the scalar reference does (same quants and
// scales, whatever its layout; the bias lanes are checked through the dot results above).
TEST(PreparedActivationsTest, QuantizationIsBitIdenticalAcrossIsas) {
  std::mt19937 rng(testing::TestSeed());
  for (int64_t k : {32, 96, 160, 2048}) {
    const int64_t tokens = 3;
    std::vector<float> x = RandomActivations(tokens, k, rng);
    x[static_cast<size_t>(k + 1)] = 0.5f;  // a tie in the making
    for (DType dt : {DType::kQ8_0, DType::kQ4_0}) {
      PreparedActivations ref;
      ref.Prepare(x.data(), tokens, k, dt, CpuIsa::kScalar);
      for (CpuIsa cpu_isa : SupportedIsas()) {
        PreparedActivations p;
        p.Prepare(x.data(), tokens, k, dt, cpu_isa);
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t i = 0; i < k; ++i) {
            const auto [q, d] = QuantAt(p, t, i);
            const auto [q_ref, d_ref] = QuantAt(ref, t, i);
            ASSERT_EQ(q, q_ref) << CpuIsaName(cpu_isa) << " k " << k << " t " << t << " i " << i;
            ASSERT_EQ(std::memcmp(&d, &d_ref, sizeof d), 0) << CpuIsaName(cpu_isa) << " i " << i;
          }
      }
    }
  }
}

TEST(PreparedActivationsTest, StorageIsReusedWithoutReallocation) {
  std::vector<float> x(4 * 256, 1.0f);
  PreparedActivations p;
  p.Prepare(x.data(), 4, 256, DType::kQ8_0);
  const uint8_t* data = p.view().data;
  p.Prepare(x.data(), 2, 256, DType::kQ4_0);
  EXPECT_EQ(p.view().data, data);
  p.Prepare(x.data(), 4, 256, DType::kBF16, CpuIsa::kScalar);  // fp32 math: x in place
  EXPECT_EQ(p.view().x, x.data());
}

}  // namespace
}  // namespace moetier::kernels
