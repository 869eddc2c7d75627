#include "kernels/cpu/matmul.h"

#include <cstring>
#include <vector>

namespace moetier::kernels {

float DotF32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void RowToF32(const TensorView& w, int64_t offset, int64_t n, float* out) {
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, w.as<float>() + offset, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* src = w.as<uint16_t>() + offset;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(&out[i], &bits, sizeof(float));
      }
      return;
    }
    case DType::kF16: {
      const uint16_t* src = w.as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(src[i]);
      return;
    }
    default:
      // Loaders only admit weight dtypes; reaching here is a programming error.
      std::memset(out, 0, static_cast<size_t>(n) * sizeof(float));
  }
}

void MatMulRows(const float* x, int64_t n_tokens, const TensorView& w, int64_t row_begin,
                int64_t row_end, float* y, int64_t y_stride, float* row_buf) {
  const int64_t k = w.shape.back();
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* row;
    if (w.dtype == DType::kF32) {
      row = w.as<float>() + r * k;
    } else {
      RowToF32(w, r * k, k, row_buf);
      row = row_buf;
    }
    for (int64_t t = 0; t < n_tokens; ++t) y[t * y_stride + r] = DotF32(x + t * k, row, k);
  }
}

void MatMul(ThreadPool& pool, const float* x, int64_t n_tokens, const TensorView& w, float* y) {
  const int64_t n_rows = w.shape.front();
  const int64_t k = w.shape.back();
  // Rows are handed out in blocks so each thread streams a contiguous range of weight bytes.
  pool.ParallelFor(static_cast<size_t>(n_rows), [&](size_t begin, size_t end, int) {
    thread_local std::vector<float> row_buf;
    if (row_buf.size() < static_cast<size_t>(k)) row_buf.resize(static_cast<size_t>(k));
    MatMulRows(x, n_tokens, w, static_cast<int64_t>(begin), static_cast<int64_t>(end), y, n_rows,
               row_buf.data());
  });
}

}  // namespace moetier::kernels
