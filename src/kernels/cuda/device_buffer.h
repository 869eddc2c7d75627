// DeviceBuffer: one cudaMalloc'd allocation, owned and move-only. Allocated at load (VRAM is
// allocated once); steady-state steps only reuse buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "core/status.h"
#include "kernels/cuda/cuda_check.h"

namespace moetier::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // n elements of T; `what` names the buffer in an out-of-memory error.
  static Expected<DeviceBuffer> Create(size_t n, const std::string& what) {
    DeviceBuffer b;
    if (n == 0) return Expected<DeviceBuffer>(std::move(b));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, n * sizeof(T));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      return CudaStatus(
          err, "allocating " + std::to_string(n * sizeof(T)) + " bytes of VRAM for " + what);
    }
    b.data_ = static_cast<T*>(p);
    b.size_ = n;
    return Expected<DeviceBuffer>(std::move(b));
  }
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  void Release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace moetier::cuda
