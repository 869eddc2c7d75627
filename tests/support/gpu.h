// GPU tests run only where a CUDA device is present; elsewhere they skip and say so (CI has no
// GPU). Use MT_REQUIRE_GPU() as a test's first statement.
#pragma once

#include <gtest/gtest.h>

#ifdef MOETIER_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#define MT_REQUIRE_GPU()                                                    \
  do {                                                                      \
    if (!::moetier::cuda::DeviceAvailable())                                \
      GTEST_SKIP() << "skipped: no CUDA device on this machine (GPU test)"; \
  } while (0)

namespace moetier::testing {

// A device copy of v (one spare element, so an empty v still gets a valid pointer).
template <typename T>
cuda::DeviceBuffer<T> Upload(const std::vector<T>& v) {
  cuda::DeviceBuffer<T> b = cuda::DeviceBuffer<T>::Create(v.size() + 1, "test input").value();
  EXPECT_EQ(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return b;
}

// The first n elements of b, after every queued launch has finished.
template <typename T>
std::vector<T> Download(const cuda::DeviceBuffer<T>& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(v.data(), b.data(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// x (whole 32-blocks) quantized as the CPU's kernels quantize activations (kernels/cpu/
// matmul_scalar.cpp): per block, scale amax / 127 and codes round-half-even(x * (127 / amax))
// clamped to [-127, 127], 0 when amax is 0. The reference for the GPU's quantizers.
struct HostQuantized {
  std::vector<int8_t> q;
  std::vector<float> d;
};
inline HostQuantized QuantizeActivations(const std::vector<float>& x) {
  HostQuantized out{std::vector<int8_t>(x.size()), std::vector<float>(x.size() / 32)};
  for (size_t b = 0; b + 32 <= x.size(); b += 32) {
    float amax = 0.0f;
    for (size_t j = b; j < b + 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    out.d[b / 32] = amax / 127.0f;
    for (size_t j = b; j < b + 32; ++j)
      out.q[j] =
          static_cast<int8_t>(std::nearbyint(std::fmin(127.0f, std::fmax(-127.0f, x[j] * inv))));
  }
  return out;
}

// Milliseconds a call of f() takes on the default stream (CUDA events around it): the median of
// `runs` calls after `warmup` untimed ones (first launches, caches), every call finished before
// the next. For the disabled timing tests.
template <typename F>
double MedianGpuMs(F&& f, int runs = 20, int warmup = 3) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  EXPECT_EQ(cudaEventCreate(&e0), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&e1), cudaSuccess);
  std::vector<float> ms;
  for (int i = 0; i < warmup + runs; ++i) {
    cudaEventRecord(e0);
    f();
    cudaEventRecord(e1);
    EXPECT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float v = 0;
    cudaEventElapsedTime(&v, e0, e1);
    if (i >= warmup) ms.push_back(v);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace moetier::testing
#else
#define MT_REQUIRE_GPU() GTEST_SKIP() << "skipped: built without CUDA (GPU test)"
#endif
