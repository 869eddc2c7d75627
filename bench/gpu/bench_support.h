// What the GPU benchmarks share: their flags (`--name value` pairs, comma-separated lists of
// numbers) and their one-line CUDA errors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace moetier::bench {

// "1,16" as numbers of type T; stops at the first piece that is not a number.
template <typename T>
std::vector<T> ParseList(const char* s) {
  std::vector<T> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    out.push_back(static_cast<T>(std::strtod(p, &end)));
    if (end == p) break;
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// Hands each `--name value` pair of argv to set(name, value), which is false for a name it does
// not know. False, having said why on stderr as `program: ...`, for --help, a name without a value
// or one set() refused.
template <typename Set>
bool ParseFlagPairs(const char* program, int argc, char** argv, Set set) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") return false;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", program, name.c_str());
      return false;
    }
    if (!set(name, argv[++i])) {
      std::fprintf(stderr, "%s: unknown flag %s\n", program, name.c_str());
      return false;
    }
  }
  return true;
}

// True for cudaSuccess; otherwise says `program: what: the error` on stderr.
inline bool CudaOk(const char* program, cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s: %s\n", program, what, cudaGetErrorString(e));
  return false;
}

}  // namespace moetier::bench
