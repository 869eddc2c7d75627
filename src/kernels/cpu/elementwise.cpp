#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_isa.h"

namespace moetier::kernels {

void RmsNormRow(const float* x, const float* weight, float eps, int64_t n, float* y) {
  // Sum of squares in double: the mean of thousands of squares loses bits in float32, and the
  // reference (Hugging Face, computed in float64) does not.
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void SiluMul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void SoftmaxRow(float* x, int64_t n) {
  if (n <= 0) return;
  const float m = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void Axpy(float a, const float* x, int64_t n, float* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

int64_t FirstNonFinite(const float* x, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;  // all ones: inf or NaN
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    any |= (bits & kExponent) == kExponent ? 1u : 0u;
  }
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

// Eight running maxima, lane by lane: compilers vectorize that without reassociating anything (a
// max reduction pragma is refused by clang, which keeps NaN semantics, and -Werror stops it).
float MaxOf(const float* x, int64_t n) {
  constexpr int64_t kLanes = 8;
  constexpr float kBelowAll = -std::numeric_limits<float>::infinity();
  float lane[kLanes];
  for (float& v : lane) v = kBelowAll;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = kBelowAll;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (float v : lane) m = v > m ? v : m;
  return m;
}

bool AnyAtLeast(const float* x, int64_t n, float t) {
  int any = 0;
  for (int64_t i = 0; i < n; ++i) any |= x[i] >= t ? 1 : 0;
  return any != 0;
}

double SumOf(const float* x, int64_t n) {
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] += x[i + j];
  double s = 0.0;
  for (double v : lane) s += v;
  for (; i < n; ++i) s += x[i];
  return s;
}

double LogSumExp(const float* x, int64_t n) {
  const float max = MaxOf(x, n);
  if (!std::isfinite(max)) return max;
  constexpr int64_t kChunk = 1024;
  float terms[kChunk];
  double sum = 0.0;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t len = std::min(kChunk, n - begin);
    ScaledExp(x + begin, len, max, 1.0, terms);
    sum += SumOf(terms, len);
  }
  return max + std::log(sum);
}

namespace {

// e^a = 2^k * e^r, k = round(a / ln 2), r = a - k ln 2 in double (|r| <= ln 2 / 2, exact to
// double rounding), e^r by its Taylor series to degree 7 in float (truncation below 6e-9
// relative), 2^k built in the exponent bits. Arguments below kLowest (e^kLowest is under the
// smallest normal float) give 0. The selects vectorize because this file is compiled with
// -fno-trapping-math (src/kernels/cpu/CMakeLists.txt); always inlined into each ISA's copy.
__attribute__((always_inline)) inline void ScaledExpLoop(const float* x, int64_t n, float shift,
                                                         double scale, float* y) {
  constexpr double kLowest = -87.0;
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2 = 0.6931471805599453;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr float c2 = 1.0f / 2, c3 = 1.0f / 6, c4 = 1.0f / 24, c5 = 1.0f / 120, c6 = 1.0f / 720,
                  c7 = 1.0f / 5040;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const double arg = (static_cast<double>(x[i]) - static_cast<double>(shift)) * scale;
    const double a = arg > kLowest ? arg : kLowest;
    const double k = (a * kLog2e + kRound) - kRound;
    const auto r = static_cast<float>(a - k * kLn2);
    const float p =
        1.0f + r * (1.0f + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * c7))))));
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    const float two_k = std::bit_cast<float>(bits);
    y[i] = arg > kLowest ? p * two_k : 0.0f;
  }
}

#if defined(MOETIER_X86_KERNELS)
__attribute__((target("avx512f,avx512dq"))) void ScaledExpAvx512(const float* x, int64_t n,
                                                                 float shift, double scale,
                                                                 float* y) {
  ScaledExpLoop(x, n, shift, scale, y);
}
__attribute__((target("avx2,fma"))) void ScaledExpAvx2(const float* x, int64_t n, float shift,
                                                       double scale, float* y) {
  ScaledExpLoop(x, n, shift, scale, y);
}
#endif

}  // namespace

void ScaledExp(const float* x, int64_t n, float shift, double scale, float* y) {
#if defined(MOETIER_X86_KERNELS)
  const CpuIsa isa = ActiveCpuIsa();
  if (isa != CpuIsa::kScalar && isa != CpuIsa::kAvx2 && isa != CpuIsa::kAvxVnni &&
      CpuSupports(CpuIsa::kAvx512))
    return ScaledExpAvx512(x, n, shift, scale, y);
  if (isa != CpuIsa::kScalar && CpuSupports(CpuIsa::kAvx2))
    return ScaledExpAvx2(x, n, shift, scale, y);
#endif
  ScaledExpLoop(x, n, shift, scale, y);
}

// The maximum, then its first index: a single loop that reads the running best back through its
// index is a load-compare chain of ~7 cycles per element, which over a 151,936-entry vocabulary
// measured 0.7 ms, a tenth of a fast decode step.
int64_t ArgMax(const float* x, int64_t n) {
  if (n <= 0) return 0;
  const float m = MaxOf(x, n);
  // The first element equal to m is the first at least m (nothing is above it, NaN is never
  // either).
  int64_t first = 0;  // every element NaN
  ForChunksAtLeast({x, static_cast<size_t>(n)}, 0, m, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      if (x[i] == m) {
        first = static_cast<int64_t>(i);
        return false;
      }
    return true;
  });
  return first;
}

int32_t TopKCandidates(const float* x, int64_t n, int32_t k, int32_t room, LogitCandidate* out) {
  std::vector<LogitCandidate> finite;
  finite.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) finite.push_back({x[i], static_cast<int32_t>(i)});
  auto before = [](const LogitCandidate& a, const LogitCandidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  const auto kth = std::min<size_t>(static_cast<size_t>(std::max(k, 1)), finite.size());
  if (kth == 0) return 0;
  std::nth_element(finite.begin(), finite.begin() + static_cast<std::ptrdiff_t>(kth - 1),
                   finite.end(), before);
  const float floor = finite[kth - 1].logit;
  const auto end = std::partition(finite.begin(), finite.end(),
                                  [&](const LogitCandidate& c) { return c.logit >= floor; });
  const auto count = static_cast<size_t>(end - finite.begin());
  if (count > static_cast<size_t>(room)) return -1;
  std::sort(finite.begin(), end, before);
  std::copy(finite.begin(), end, out);
  return static_cast<int32_t>(count);
}

}  // namespace moetier::kernels
