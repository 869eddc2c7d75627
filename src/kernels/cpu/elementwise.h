// Row-wise float32 operations used between the matrix products. Math only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "core/logit_candidate.h"

namespace moetier::kernels {

// y[i] = x[i] / sqrt(mean(x²) + eps) * weight[i], for one row of n elements (x may equal y).
void RmsNormRow(const float* x, const float* weight, float eps, int64_t n, float* y);

// gate[i] = silu(gate[i]) * up[i], silu(v) = v / (1 + e^-v).
void SiluMul(float* gate, const float* up, int64_t n);

// In-place numerically stable softmax of one row.
void SoftmaxRow(float* x, int64_t n);

// y[i] += a * x[i]
void Axpy(float a, const float* x, int64_t n, float* y);

// The index of the first NaN or infinite element of x[0, n), or -1 when all are finite. One
// vectorized pass over the bits (exponent all ones) in the common all-finite case.
int64_t FirstNonFinite(const float* x, int64_t n);

// The largest of x[0, n), vectorized; NaN never wins (-inf when nothing else is there).
float MaxOf(const float* x, int64_t n);

// Whether some x[i] >= t in [0, n) (NaN never is), one vectorized scan without an early exit:
// for scanning a long row in short chunks, most of which hold nothing at or above t.
bool AnyAtLeast(const float* x, int64_t n, float t);

// Calls body(begin, end) for the chunks of x[from, size) (kScanChunk elements, the last maybe
// fewer) that hold a value >= t, in order; t is read anew before each chunk, so a body may raise
// it, and a body that returns bool ends the walk by returning false. The chunks without one,
// most of a row when t is near its top, cost one AnyAtLeast each.
inline constexpr size_t kScanChunk = 64;
template <typename Body>
void ForChunksAtLeast(std::span<const float> x, size_t from, const float& t, Body&& body) {
  for (size_t begin = from; begin < x.size(); begin += kScanChunk) {
    const size_t end = std::min(x.size(), begin + kScanChunk);
    if (!AnyAtLeast(x.data() + begin, static_cast<int64_t>(end - begin), t)) continue;
    if constexpr (std::is_void_v<decltype(body(begin, end))>) {
      body(begin, end);
    } else if (!body(begin, end)) {
      return;
    }
  }
}

// y[i] = e^((x[i] - shift) * scale) for x[i] <= shift and scale >= 0 (the sampler's weights:
// shift the largest logit, scale 1 / temperature), the product taken in double so that no scale
// overflows; within 2e-7 of the exact value relative, 0 where that is below e^-87 (~1.6e-38).
// Vectorized (its own exponential, not libm's).
void ScaledExp(const float* x, int64_t n, float shift, double scale, float* y);

// The sum of x[0, n) in double, eight running sums lane by lane (vectorized), then theirs.
double SumOf(const float* x, int64_t n);

// log Σ e^x[i] over x[0, n): shifted by the largest value so that no term overflows, the terms
// by ScaledExp, summed in double. The largest value when that is not finite (-inf for an empty
// row or one of -inf only). Rows holding NaN have no defined result.
double LogSumExp(const float* x, int64_t n);

// The index of the largest of x[0, n), the lowest among equal ones (greedy sampling's pick); 0
// when n is 0 or every element is NaN.
int64_t ArgMax(const float* x, int64_t n);

// x[0, n)'s finite elements of at least the k-th largest finite value (k >= 1; every tie with
// it; all of them when fewer than k), largest first, equal values by index ascending, into out:
// returns their number, or -1 when that is more than `room` (out then holds nothing useful).
int32_t TopKCandidates(const float* x, int64_t n, int32_t k, int32_t room, LogitCandidate* out);

}  // namespace moetier::kernels
