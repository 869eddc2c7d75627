#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

namespace moetier::cuda {
namespace {

// Set by src/kernels/cuda/CMakeLists.txt from the toolkit found at configure time.
constexpr const char* kSoname = MOETIER_CUBLAS_SONAME;
constexpr const char* kToolkitDir = MOETIER_CUBLAS_DIR;

std::string LastDlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown error";
}

template <typename F>
Status Resolve(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  if (out != nullptr) return OkStatus();
  return Status::Error(std::string(kSoname) + " has no " + name + " (" + LastDlError() +
                       "): not the cuBLAS this moetier was built against");
}

Expected<CublasLibrary> Open() {
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string by_name = LastDlError();
    handle = dlopen((std::string(kToolkitDir) + "/" + kSoname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr)
      return Status::Error("cannot load cuBLAS (" + std::string(kSoname) +
                           ", for prefill's dense matrix products): " + by_name + "; " +
                           LastDlError() +
                           ". Install the CUDA toolkit's cuBLAS or add its folder to "
                           "LD_LIBRARY_PATH");
  }
  CublasLibrary lib;  // the handle stays open for the process's life
  MT_RETURN_IF_ERROR(Resolve(handle, "cublasCreate_v2", lib.create));
  MT_RETURN_IF_ERROR(Resolve(handle, "cublasDestroy_v2", lib.destroy));
  MT_RETURN_IF_ERROR(Resolve(handle, "cublasSetStream_v2", lib.set_stream));
  MT_RETURN_IF_ERROR(Resolve(handle, "cublasSetWorkspace_v2", lib.set_workspace));
  MT_RETURN_IF_ERROR(Resolve(handle, "cublasGemmEx", lib.gemm_ex));
  return lib;
}

}  // namespace

Expected<const CublasLibrary*> LoadCublas() {
  static const Expected<CublasLibrary> loaded = Open();
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

}  // namespace moetier::cuda
