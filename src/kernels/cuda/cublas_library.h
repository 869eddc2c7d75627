// cuBLAS's entry points that prefill's dense products use, from its shared library loaded at
// first use (dlopen) rather than linked: a linked libcublas runs libcublasLt's static
// initializers in every moetier process before main, ~0.3 s measured (perf: 43 % of
// `moetier --version`), GPU or not.
#pragma once

#include <cublas_v2.h>

#include "core/status.h"

namespace moetier::cuda {

struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  // The 32-bit-size cublasGemmEx (C++ also sees an inline 64-bit overload of the name).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
};

// The library, loaded once by the first caller (others wait for it): by its name from the
// loader's search path (LD_LIBRARY_PATH, the system's), else from the CUDA toolkit this build was
// configured with. An error names the library and what dlopen or dlsym said.
Expected<const CublasLibrary*> LoadCublas();

}  // namespace moetier::cuda
