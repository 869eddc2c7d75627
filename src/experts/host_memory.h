// Page-locking host memory: mlock for the CPU, cudaHostRegister for the GPU. The CUDA part is
// compiled only with MOETIER_CUDA; without it no GPU is present and every pin fails, so the
// degrade path (pinned → locked) serves every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace moetier {

// Whether a CUDA device is usable by this process (false in builds without CUDA).
bool GpuAvailable();
// "NVIDIA H200" or "none".
std::string GpuName();
// Free memory of GPU 0 now (0 without one).
uint64_t GpuFreeBytes();

// cudaHostRegister(ptr, n_bytes) with the mapped flag; on success *device_ptr is the device
// address of ptr. Fails (with CUDA's message) without a GPU.
Status RegisterHostMemory(void* ptr, size_t n_bytes, void** device_ptr);
void UnregisterHostMemory(void* ptr);

// Copies n_bytes from a device address to host memory (for tests that read a pinned bank through
// its device pointer). Fails without a GPU.
Status CopyDeviceToHost(const void* device_src, void* host_dst, size_t n_bytes);

// mlock / munlock of exactly [ptr, ptr + n_bytes).
Status LockMemory(void* ptr, size_t n_bytes);
void UnlockMemory(void* ptr, size_t n_bytes);

}  // namespace moetier
