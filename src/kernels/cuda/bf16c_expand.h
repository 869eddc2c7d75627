// BF16C rows expanded to bf16 on the device. A matrix or bank packed as BF16C (kernels/cpu/
// bf16c.h: the same bf16 values in ~77 % of the bytes) crosses PCIe in its packed form and is
// expanded in VRAM, where the bf16 kernels read it: the bf16 an unpacked copy would have put
// there, bit for bit, so outputs do not depend on which form was copied. Math only: the caller
// says where the packed rows are and where their bf16 go.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace moetier::cuda {

// The dtype in which the GPU computes weights held as `held`: BF16C is expanded to bf16 first.
inline DType GpuDType(DType held) {
  return held == DType::kBF16C ? DType::kBF16 : held;
}

// n_rows packed rows of k weights back to back at `packed`, to n_rows x k bf16 at `out`. Both
// device addresses, 16-byte aligned; k a multiple of 32 (whole BF16C blocks).
struct Bf16cRows {
  const uint8_t* packed = nullptr;
  uint8_t* out = nullptr;
  int64_t n_rows = 0;
  int64_t k = 0;
};

// Expands every entry of `rows` on `stream` (any number; a launch per 64). A row's exceptions
// are applied in list order after its blocks, as UnpackRowBf16c does; indices past the row are
// ignored.
void LaunchExpandBf16cRows(std::span<const Bf16cRows> rows, cudaStream_t stream);

// One expert: its three packed matrices back to back (gate and up [width rows of d_model], down
// [d_model rows of width], as ExpertLayout lays them out) at `packed`, and the slot their bf16
// rows go to (the same three matrices, row after row) at `slot`.
struct Bf16cExpansion {
  const uint8_t* packed = nullptr;
  uint8_t* slot = nullptr;
};

// LaunchExpandBf16cRows over the experts' matrices (d_model and width multiples of 32).
void LaunchExpandBf16c(std::span<const Bf16cExpansion> experts, int64_t d_model, int64_t width,
                       cudaStream_t stream);

}  // namespace moetier::cuda
