#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

// The maximum, then its first index: a single loop that reads the running best back through its
// index is a load-compare chain of ~7 cycles per element, which over a 151,936-entry vocabulary
// measured 0.7 ms, a tenth of a fast decode step.
int64_t ArgMax(const float* x, int64_t n) {
  if (n <= 0) return 0;
  const float m = MaxOf(x, n);
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == m) return i;
  return 0;  // every element NaN
}

}  // namespace moetier::kernels
