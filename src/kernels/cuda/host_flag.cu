#include "kernels/cuda/host_flag.h"

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {

namespace {

// Nanoseconds between polls: one PCIe read each; the host side this waits for takes tens of
// microseconds at least.
constexpr unsigned kPollNs = 256;

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void WaitForHostKernel(const volatile uint32_t* flag, uint32_t value,
                                  uint64_t timeout_ns, volatile uint32_t* timed_out) {
  PdlWait();
  const uint64_t start = GlobalTimerNs();
  while (static_cast<int32_t>(*flag - value) < 0) {
    if (GlobalTimerNs() - start > timeout_ns) {
      *timed_out = 1;
      break;
    }
    __nanosleep(kPollNs);
  }
  __threadfence_system();  // what follows on the stream reads after the flag
}

}  // namespace

Expected<HostFlag> HostFlag::Create() {
  int device = 0, can_map = 0;
  MT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "HostFlag");
  MT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, device),
                          "HostFlag");
  if (can_map == 0) return Status::Error("HostFlag: this GPU cannot map host memory");
  HostFlag f;
  void* p = nullptr;
  MT_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, 2 * sizeof(uint32_t), cudaHostAllocMapped),
                          "HostFlag: mapped pinned memory");
  f.host_ = static_cast<uint32_t*>(p);
  f.host_[0] = f.host_[1] = 0;
  void* d = nullptr;
  MT_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&d, p, 0), "HostFlag: its device address");
  f.device_ = static_cast<uint32_t*>(d);
  return Expected<HostFlag>(std::move(f));
}

HostFlag::~HostFlag() {
  if (host_ != nullptr) cudaFreeHost(host_);
}

HostFlag::HostFlag(HostFlag&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)),
      device_(std::exchange(o.device_, nullptr)),
      issued_(o.issued_) {}

HostFlag& HostFlag::operator=(HostFlag&& o) noexcept {
  if (this != &o) {
    if (host_ != nullptr) cudaFreeHost(host_);
    host_ = std::exchange(o.host_, nullptr);
    device_ = std::exchange(o.device_, nullptr);
    issued_ = o.issued_;
  }
  return *this;
}

void HostFlag::QueueWait(uint32_t value, uint32_t timeout_ms, cudaStream_t stream) const {
  Launch(WaitForHostKernel, 1, 1, 0, stream, device_, value, uint64_t{timeout_ms} * 1000000u,
         device_ + 1);
}

void HostFlag::Publish(uint32_t value) const {
  std::atomic_ref<uint32_t>(host_[0]).store(value, std::memory_order_release);
}

bool HostFlag::TimedOut() const {
  return std::atomic_ref<uint32_t>(host_[1]).load(std::memory_order_acquire) != 0;
}

void HostFlag::Clear() const {
  std::atomic_ref<uint32_t>(host_[1]).store(0, std::memory_order_relaxed);
}

}  // namespace moetier::cuda
