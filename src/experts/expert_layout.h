// Where each matrix of an expert sits inside a bank: gate [width, d_model], up [width, d_model],
// down [d_model, width], packed, experts `stride_bytes` apart (rounded up to kBankAlignment so
// every expert starts on a 4096-byte boundary: one DMA, one O_DIRECT range).
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

  uint64_t matrix_bytes() const {
    return static_cast<uint64_t>(d_model) * static_cast<uint64_t>(width) * DTypeSize(dtype);
  }
  uint64_t stride_bytes() const { return AlignUp(3 * matrix_bytes(), kBankAlignment); }
  uint64_t bank_bytes(int64_t n_experts) const {
    return stride_bytes() * static_cast<uint64_t>(n_experts);
  }
  uint64_t gate_offset() const { return 0; }
  uint64_t up_offset() const { return matrix_bytes(); }
  uint64_t down_offset() const { return 2 * matrix_bytes(); }

  // Views of expert `e` of a bank starting at `bank`.
  ExpertWeights Views(const uint8_t* bank, int64_t e) const {
    const uint8_t* base = bank + static_cast<uint64_t>(e) * stride_bytes();
    ExpertWeights w;
    w.gate = TensorView{dtype, {width, d_model}, base + gate_offset(), matrix_bytes()};
    w.up = TensorView{dtype, {width, d_model}, base + up_offset(), matrix_bytes()};
    w.down = TensorView{dtype, {d_model, width}, base + down_offset(), matrix_bytes()};
    return w;
  }
};

}  // namespace moetier
