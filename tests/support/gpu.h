// GPU tests run only where a CUDA device is present; elsewhere they skip and say so (CI has no
// GPU). Use MT_REQUIRE_GPU() as a test's first statement.
#pragma once

#include <gtest/gtest.h>

#ifdef MOETIER_WITH_CUDA
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

}  // namespace moetier::testing
#else
#define MT_REQUIRE_GPU() GTEST_SKIP() << "skipped: built without CUDA (GPU test)"
#endif
