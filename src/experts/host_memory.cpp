#include "experts/host_memory.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifdef MOETIER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moetier {

#ifdef MOETIER_WITH_CUDA
bool GpuAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string GpuName() {
  if (!GpuAvailable()) return "none";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "unknown";
  return prop.name;
}

uint64_t GpuFreeBytes() {
  size_t free = 0, total = 0;
  if (!GpuAvailable() || cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return free;
}

Status RegisterHostMemory(void* ptr, size_t n_bytes, void** device_ptr) {
  if (!GpuAvailable()) return Status::Error("no CUDA device");
  cudaError_t e = cudaHostRegister(ptr, n_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return Status::Error(std::string("cudaHostRegister: ") + cudaGetErrorString(e));
  }
  e = cudaHostGetDevicePointer(device_ptr, ptr, 0);
  if (e != cudaSuccess) {
    cudaHostUnregister(ptr);
    cudaGetLastError();
    return Status::Error(std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(e));
  }
  return OkStatus();
}

void UnregisterHostMemory(void* ptr) {
  cudaHostUnregister(ptr);
}

Status CopyDeviceToHost(const void* device_src, void* host_dst, size_t n_bytes) {
  cudaError_t e = cudaMemcpy(host_dst, device_src, n_bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return Status::Error(std::string("cudaMemcpy: ") + cudaGetErrorString(e));
  return OkStatus();
}
#else
bool GpuAvailable() {
  return false;
}
std::string GpuName() {
  return "none";
}
uint64_t GpuFreeBytes() {
  return 0;
}
Status RegisterHostMemory(void*, size_t, void**) {
  return Status::Error("this build has no CUDA support (configure with -DMOETIER_CUDA=ON)");
}
void UnregisterHostMemory(void*) {}
Status CopyDeviceToHost(const void*, void*, size_t) {
  return Status::Error("this build has no CUDA support");
}
#endif

// The raw system calls, not the libc wrappers: AddressSanitizer intercepts mlock/munlock and
// turns them into successful no-ops, which would make the report claim locked bytes that VmLck
// does not show.
Status LockMemory(void* ptr, size_t n_bytes) {
  if (::syscall(SYS_mlock, ptr, n_bytes) != 0)
    return Status::Error(std::string("mlock: ") + std::strerror(errno));
  return OkStatus();
}

void UnlockMemory(void* ptr, size_t n_bytes) {
  ::syscall(SYS_munlock, ptr, n_bytes);
}

}  // namespace moetier
