// Dense matrix products on the GPU: y[T, rows] = x[T, cols] · Wᵀ, float32 activations, weights
// f32, f16, bf16 (fp32 accumulation), Q8_0 or Q4_0 (activations quantized to 8 bits per
// 32-block as the CPU's kernels do, integer dots, per-block scales in fp32: kernels/cpu/
// matmul.h). Few tokens (decode) run our own kernels, which read each weight byte once for all
// tokens; many tokens (prefill) may use cuBLAS tensor-core GEMMs on bf16/f16 copies of the
// operands (stated tolerance), the weights dequantized tile by tile for Q8_0/Q4_0.
//
// Contract: a DenseMatMul is used by one thread and one stream at a time; Run queues work on
// `stream` and allocates nothing (scratch is sized at Create).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "kernels/cuda/device_matrix.h"

namespace moetier::cuda {

class DenseMatMul {
 public:
  // Scratch for up to max_tokens activations of up to max_cols columns and outputs of up to
  // max_rows rows (quantized/converted activations, GEMM workspace), and the cuBLAS handle.
  static Expected<DenseMatMul> Create(int64_t max_tokens, int64_t max_cols, int64_t max_rows);
  DenseMatMul();
  ~DenseMatMul();
  DenseMatMul(DenseMatMul&&) noexcept;
  DenseMatMul& operator=(DenseMatMul&&) noexcept;

  // The most tokens a product takes on the decode kernels; more go to cuBLAS. Up to here the
  // weight stream (or, from ~16 tokens, CUDA-core FMAs) costs less than a tensor-core GEMM's
  // operand conversion, and the results keep fp32 activations (1e-5 agreement with the CPU).
  static constexpr int64_t kMaxDecodeTokens = 64;

  // y [n_tokens, w.rows] (row stride w.rows) = x [n_tokens, w.cols] · wᵀ; n_tokens <= max_tokens.
  // x8, when given, is x quantized (n_tokens <= kMaxDecodeTokens rows of w.cols): a Q8_0/Q4_0
  // product reads it instead of quantizing x itself (the same bits).
  void Run(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y, cudaStream_t stream,
           const QuantizedActs* x8 = nullptr);
  // Run for each product, of the same x (the q, k and v projections): decode runs up to four
  // that share a dtype and their width as one launch (a quantized x quantized once, or read from
  // x8 as Run's). The same bits as Run.
  struct Product {
    const DeviceMatrix* w = nullptr;
    float* y = nullptr;
  };
  void RunAll(std::span<const Product> products, const float* x, int64_t n_tokens,
              cudaStream_t stream, const QuantizedActs* x8 = nullptr);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace moetier::cuda
