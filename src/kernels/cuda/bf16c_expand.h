// BF16C experts expanded to bf16 on the device. A bank packed as BF16C (kernels/cpu/bf16c.h: the
// same bf16 values in ~77 % of the bytes) crosses PCIe in its packed form and is expanded into a
// slot of the expert cache, where the bf16 expert kernels read it: the bf16 a bank stored as
// bf16 would have put there, bit for bit, so outputs do not depend on which form was copied.
// Math only: the caller says where each expert's packed bytes and its slot are.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace moetier::cuda {

// The dtype in which the GPU computes experts held as `held`: BF16C is expanded to bf16 first.
inline DType GpuExpertDType(DType held) {
  return held == DType::kBF16C ? DType::kBF16 : held;
}

// One expert: its three packed matrices back to back (gate and up [width rows of d_model], down
// [d_model rows of width], as ExpertLayout lays them out) at `packed`, and the slot their bf16
// rows go to (the same three matrices, row after row) at `slot`. Both device addresses, 16-byte
// aligned.
struct Bf16cExpansion {
  const uint8_t* packed = nullptr;
  uint8_t* slot = nullptr;
};

// Expands every expert of `experts` on `stream` (any number; a launch per 64). d_model and
// width: multiples of 32 (whole BF16C blocks). A row's exceptions are applied in list order
// after its blocks, as UnpackRowBf16c does; indices past the row are ignored.
void LaunchExpandBf16c(std::span<const Bf16cExpansion> experts, int64_t d_model, int64_t width,
                       cudaStream_t stream);

}  // namespace moetier::cuda
