// GPU tests run only where a CUDA device is present; elsewhere they skip and say so (CI has no
// GPU). Use MT_REQUIRE_GPU() as a test's first statement.
#pragma once

#include <gtest/gtest.h>

#ifdef MOETIER_WITH_CUDA
#include <algorithm>
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
