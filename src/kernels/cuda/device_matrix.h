// A weight matrix in device memory (VRAM, or a pinned host bank mapped for the device): what
// core/tensor.h's TensorView is on the host. Row-major [rows, cols]; a row of a Q8_0/Q4_0
// matrix is cols/32 GGUF blocks back to back (kernels/cpu/quant.h), of the other dtypes cols
// elements.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace moetier::cuda {

struct DeviceMatrix {
  DType dtype = DType::kF32;  // kF32, kF16, kBF16, kQ8_0 or kQ4_0
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;  // device address
};

// Activation rows quantized per 32-block as the Q8_0/Q4_0 products quantize theirs (QuantizeLane,
// device_math.cuh; the CPU's quantizer bit for bit): q [rows, cols] int8 and d [rows, cols / 32]
// scales, device addresses. A norm can write them beside its float rows (elementwise.h) for a
// product of those rows to read instead of quantizing (dense.h).
struct QuantizedActs {
  int8_t* q = nullptr;
  float* d = nullptr;
};

}  // namespace moetier::cuda
