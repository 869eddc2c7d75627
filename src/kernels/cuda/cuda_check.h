// CUDA runtime errors as moetier Status values, and the one check the launchers share. Math
// kernels report nothing themselves: a launcher queues work on a stream and the caller learns of
// a failed launch (a bad configuration) at once and of a fault at the next synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "core/status.h"

namespace moetier::cuda {

// Status::Error("<what>: <CUDA's name for err>: <its description>") or OK.
inline Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return OkStatus();
  return Status::Error(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                       cudaGetErrorString(err));
}

// Whether a CUDA device is usable by this process (the runtime loads, a device answers).
inline bool DeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace moetier::cuda

// Returns the failure of a CUDA call; `what` (a message, maybe built from pieces) is evaluated only
// then, so a call that succeeds costs no allocation (replayed decode steps make none).
#define MT_CUDA_RETURN_IF_ERROR(expr, what)                                                    \
  do {                                                                                         \
    const cudaError_t mt_cuda_err_ = (expr);                                                   \
    if (mt_cuda_err_ != cudaSuccess) return ::moetier::cuda::CudaStatus(mt_cuda_err_, (what)); \
  } while (0)
