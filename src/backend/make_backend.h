// The one place that turns ComputeOptions into a backend: the CPU's, or the GPU's in builds
// with CUDA (a build without it refuses the GPU with an error saying so).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"
#include "ops/expert_source.h"

namespace moetier {

// `experts` must outlive the backend. ComputeOptions::wrap, when set, wraps the result.
Expected<std::unique_ptr<ComputeBackend>> MakeBackend(const ComputeOptions& options,
                                                      const ExpertSource& experts,
                                                      const ModelDims& dims);

// Whether the GPU backend takes a model of these dims; an error naming why not (or that this
// build has no CUDA).
Status CheckGpuDims(const ModelDims& dims);

// Starts what the GPU backend needs before its first use: the CUDA driver, GPU 0's primary
// context (which the first pin or allocation would otherwise wait for) and cuBLAS (loaded, not
// linked: kernels/cuda/cublas_library.h), together a fraction of a second or more. A load runs
// it beside its first reads. Whether a GPU answered (false in a build without CUDA).
bool StartGpu();

}  // namespace moetier
