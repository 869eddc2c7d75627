// Log-sum-exp of logit rows (log_sum_exp.h): one block a row, which reads the row twice: for its
// largest value, then for the sum of e^(x - largest) in double; each thread's share is reduced
// by warps.
#include "kernels/cuda/log_sum_exp.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarp;

// The block's largest value of `v` (NaN skipped), in every thread.
__device__ float BlockMax(float v, float* shared) {
  v = WarpMax(v);
  if (threadIdx.x % kWarp == 0) shared[threadIdx.x / kWarp] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, shared[w]);
  return m;
}

// The block's sum of `v`, in thread 0 (a fixed order: the same bits for the same input).
__device__ double BlockSum(double v, double* shared) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % kWarp == 0) shared[threadIdx.x / kWarp] = v;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) s += shared[w];
  return s;
}

__global__ void __launch_bounds__(kThreads)
    LogSumExpRowsKernel(const float* x, int64_t n, const int32_t* tokens, RowLogSum* out) {
  PdlWait();
  __shared__ float warp_max[kWarps];
  __shared__ double warp_sum[kWarps];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) m = fmaxf(m, xr[i]);
  m = BlockMax(m, warp_max);
  double s = 0.0;
  if (isfinite(m))
    for (int64_t i = threadIdx.x; i < n; i += kThreads) s += static_cast<double>(expf(xr[i] - m));
  s = BlockSum(s, warp_sum);
  if (threadIdx.x != 0) return;
  RowLogSum r;
  r.log_sum_exp = isfinite(m) ? static_cast<double>(m) + log(s) : static_cast<double>(m);
  const int32_t token = tokens != nullptr ? tokens[row] : -1;
  r.token = token >= 0 && token < n ? token : -1;
  r.token_logit = r.token >= 0 ? xr[r.token] : NAN;
  out[row] = r;
}

}  // namespace

void LaunchLogSumExpRows(const float* x, int64_t n_rows, int64_t n, const int32_t* tokens,
                         RowLogSum* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  Launch(LogSumExpRowsKernel, dim3(static_cast<unsigned>(n_rows)), dim3(kThreads), 0, stream, x, n,
         tokens, out);
}

}  // namespace moetier::cuda
