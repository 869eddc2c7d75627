#include "backend/make_backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef MOETIER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace moetier {

namespace {

Expected<std::unique_ptr<ComputeBackend>> MakeDeviceBackend(const ComputeOptions& options,
                                                            const ExpertSource& experts,
                                                            const ModelDims& dims) {
  switch (options.device) {
    case ComputeDevice::kCpu:
      return std::unique_ptr<ComputeBackend>(
          std::make_unique<CpuBackend>(options.n_threads, experts, dims.d_model));
    case ComputeDevice::kGpu:
#ifdef MOETIER_WITH_CUDA
      return CudaBackend::Create(options, experts, dims);
#else
      return Status::Error(
          "this moetier was built without CUDA: --moe-backend gpu needs a build with the CUDA "
          "toolkit (README, Build)");
#endif
  }
  return Status::Error("unknown compute device");
}

}  // namespace

Expected<std::unique_ptr<ComputeBackend>> MakeBackend(const ComputeOptions& options,
                                                      const ExpertSource& experts,
                                                      const ModelDims& dims) {
  MT_ASSIGN_OR_RETURN(std::unique_ptr<ComputeBackend> backend,
                      MakeDeviceBackend(options, experts, dims));
  if (options.wrap) return options.wrap(std::move(backend));
  return backend;
}

Status CheckGpuDims(const ModelDims& dims) {
#ifdef MOETIER_WITH_CUDA
  return CudaBackend::CheckDims(dims);
#else
  (void)dims;
  return Status::Error("this moetier was built without CUDA");
#endif
}

bool StartGpu() {
#ifdef MOETIER_WITH_CUDA
  if (!cuda::DeviceAvailable() || cudaFree(nullptr) != cudaSuccess) return false;
  (void)cuda::LoadCublas();  // a failure is reported where prefill needs it
  return true;
#else
  return false;
#endif
}

}  // namespace moetier
