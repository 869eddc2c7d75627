// Element-wise and per-row CUDA kernels of the forward pass: the embedding gather, RMSNorm, the
// residual add, SwiGLU's gate, the non-finite scan and greedy sampling's arg-max. Each mirrors the
// CPU kernel it replaces (kernels/cpu/elementwise.h, the CPU backend);
// tests/kernels/cuda/elementwise_test.cpp states the tolerances. All pointers are device addresses;
// work is queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_matrix.h"

namespace moetier::cuda {

// h[t, :] = table row tokens[t] as float32 (table: f32, f16, bf16, Q8_0 or Q4_0).
void LaunchEmbed(const DeviceMatrix& table, const int32_t* tokens, int64_t n_tokens, float* h,
                 cudaStream_t stream);

// y[i, :] = x[r, :] * (1 / sqrt(mean(x[r, :]^2) + eps)) * weight, r = rows[i] (rows == nullptr:
// r = i), for i < n_rows; d elements a row; weight [d] float32. With yq.q (only where
// NormQuantizes(d)) y's rows also go there quantized: yq [n_rows, d].
void LaunchRmsNorm(const float* x, const int32_t* rows, int64_t n_rows, const float* weight,
                   float eps, int64_t d, float* y, cudaStream_t stream, QuantizedActs yq = {});

// h[i, :] += x[i, :], then y[i, :] = RmsNorm(h[i, :]) as LaunchRmsNorm, i < n_rows: the residual
// add and the norm after it in one launch (the same bits as the two). With `first`, also
// LaunchFirstNonFinite of the sums h[0, n_rows * d); with yq.q, y quantized as LaunchRmsNorm's.
void LaunchAddRmsNorm(const float* x, int64_t n_rows, float* h, const float* weight, float eps,
                      int64_t d, float* y, cudaStream_t stream, unsigned long long* first = nullptr,
                      QuantizedActs yq = {});

// Whether the norms can quantize rows of d as they write them: whole 32-blocks, a row held in a
// block's registers.
bool NormQuantizes(int64_t d);

// y[i] += x[i], i < n.
void LaunchAdd(const float* x, int64_t n, float* y, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i], i < n.
void LaunchSiluMul(float* gate, const float* up, int64_t n, cudaStream_t stream);

// *first = min(*first, index of the first NaN or infinity of x[0, n)). The caller sets *first
// to INT64_MAX (as unsigned long long: ~0ull >> 1) before, and reads it after the stream syncs.
void LaunchFirstNonFinite(const float* x, int64_t n, unsigned long long* first,
                          cudaStream_t stream);

// For each row r < n_rows of x [n_rows, n]: keys[r] = the arg-max key of its largest element
// (the lowest index among equal ones; NaN never wins), for ArgMaxKeyIndex; and, as
// LaunchFirstNonFinite, *first = min(*first, index in x of the first NaN or infinity) unless
// first is null. keys is cleared on the stream first.
void LaunchArgMaxRows(const float* x, int64_t n_rows, int64_t n, unsigned long long* keys,
                      unsigned long long* first, cudaStream_t stream);

// The column an arg-max key names: kernels::ArgMax of the row where it is finite (0 for a row of
// NaN).
inline int32_t ArgMaxKeyIndex(unsigned long long key) {
  return key == 0 ? 0 : static_cast<int32_t>(~static_cast<uint32_t>(key));
}

}  // namespace moetier::cuda
