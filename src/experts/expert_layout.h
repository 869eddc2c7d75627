// Where each matrix of an expert sits inside a bank: gate [width, d_model], up [width, d_model],
// down [d_model, width], packed, experts `stride_bytes` apart (rounded up to kBankAlignment so
// every expert starts on a 4096-byte boundary: one DMA, one O_DIRECT range).
//
// Byte sizes go through DTypeRowBytes, never elements × DTypeSize (0 for Q8_0 / Q4_0): a
// quantized row of k weights is k/32 blocks, so a gate/up row (d_model weights) and a down row
// (width weights) differ in bytes whenever d_model != width. (The three matrices' totals come
// out equal only because valid() requires whole blocks; each is still computed from its own
// rows, the way the matmul kernels stride through it.)
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "experts/host_bank.h"
#include "ops/expert_source.h"

namespace moetier {

struct ExpertLayout {
  int64_t d_model = 0;
  int64_t width = 0;
  DType dtype = DType::kBF16;

  // True when both row lengths fit `dtype` (whole 32-blocks for Q8_0 / Q4_0).
  bool valid() const { return IsValidRowLength(dtype, d_model) && IsValidRowLength(dtype, width); }

  // Bytes of gate, and of up: width rows of d_model weights.
  uint64_t gate_up_bytes() const {
    return static_cast<uint64_t>(width) * DTypeRowBytes(dtype, d_model);
  }
  // Bytes of down: d_model rows of width weights.
  uint64_t down_bytes() const {
    return static_cast<uint64_t>(d_model) * DTypeRowBytes(dtype, width);
  }
  // Bytes of one expert's three matrices, before padding to the stride.
  uint64_t expert_bytes() const { return 2 * gate_up_bytes() + down_bytes(); }
  uint64_t stride_bytes() const { return AlignUp(expert_bytes(), kBankAlignment); }
  uint64_t bank_bytes(int64_t n_experts) const {
    return stride_bytes() * static_cast<uint64_t>(n_experts);
  }
  uint64_t gate_offset() const { return 0; }
  uint64_t up_offset() const { return gate_up_bytes(); }
  uint64_t down_offset() const { return 2 * gate_up_bytes(); }

  // Views of expert `e` of a bank starting at `bank`.
  ExpertWeights Views(const uint8_t* bank, int64_t e) const {
    const uint8_t* base = bank + static_cast<uint64_t>(e) * stride_bytes();
    ExpertWeights w;
    w.gate = TensorView{dtype, {width, d_model}, base + gate_offset(), gate_up_bytes()};
    w.up = TensorView{dtype, {width, d_model}, base + up_offset(), gate_up_bytes()};
    w.down = TensorView{dtype, {d_model, width}, base + down_offset(), down_bytes()};
    return w;
  }
};

}  // namespace moetier
