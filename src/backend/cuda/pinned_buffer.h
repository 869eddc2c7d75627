// PinnedBuffer: page-locked host memory from cudaMallocHost, owned and move-only: where the
// backend stages what crosses PCIe each step (the batch's indices in, logits and counters out),
// so copies run at full speed and asynchronously. Grows only when a step needs more.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "core/status.h"
#include "kernels/cuda/cuda_check.h"

namespace moetier::cuda {

template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Release(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least n elements (contents not kept when it grows). The caller makes sure no copy still
  // reads or writes the old memory.
  Status Reserve(size_t n, const std::string& what) {
    if (n <= size_) return OkStatus();
    Release();
    void* p = nullptr;
    MT_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&p, n * sizeof(T)),
        "allocating " + std::to_string(n * sizeof(T)) + " bytes of pinned host memory for " + what);
    data_ = static_cast<T*>(p);
    size_ = n;
    return OkStatus();
  }
  T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace moetier::cuda
