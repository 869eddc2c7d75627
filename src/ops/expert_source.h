// ExpertSource: the only way the MoE block reaches routed-expert weights. Where the bytes live
// (a checkpoint's mmap, a host bank in some tier, a GPU cache slot) is the implementation's
// business; the MoE block only asks for an expert's three matrices.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace moetier {

enum class ExpertMatrix { kGate, kUp, kDown };

// One SwiGLU expert: out = down · (silu(gate · x) ⊙ (up · x)).
struct ExpertWeights {
  TensorView gate;  // [expert_width, d_model]
  TensorView up;    // [expert_width, d_model]
  TensorView down;  // [d_model, expert_width]
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // Valid for MoE layers and expert < n_experts; the reference lives as long as the source.
  virtual const ExpertWeights& Expert(int64_t layer, int64_t expert) const = 0;
};

}  // namespace moetier
