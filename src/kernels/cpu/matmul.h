// Matrix products of float32 activations with weights stored as bf16, f16 or f32, in float32
// arithmetic. Math only: no model knowledge.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace moetier::kernels {

// dot(a, b) over n float32 elements.
float DotF32(const float* a, const float* b, int64_t n);

// Converts `n` elements of a row of a bf16/f16/f32 tensor starting at element `offset` to f32.
void RowToF32(const TensorView& w, int64_t offset, int64_t n, float* out);

// y[t, r] = dot(x[t, :], w[r, :]) for t < n_tokens and rows r in [row_begin, row_end), where
// w is [n_rows, k] and x is [n_tokens, k] (row stride k). y has row stride y_stride.
// Each weight row is read once for all tokens, so prefill reads the weights once per call.
// Runs on the calling thread; `row_buf` holds k floats of scratch.
void MatMulRows(const float* x, int64_t n_tokens, const TensorView& w, int64_t row_begin,
                int64_t row_end, float* y, int64_t y_stride, float* row_buf);

// y[n_tokens, n_rows] = x[n_tokens, k] · w[n_rows, k]ᵀ, split over rows across the pool. Every
// output element is computed by one thread in a fixed order, so results do not depend on the
// number of threads.
void MatMul(ThreadPool& pool, const float* x, int64_t n_tokens, const TensorView& w, float* y);

}  // namespace moetier::kernels
