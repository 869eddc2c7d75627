// ExpertSource: the only way the MoE block reaches routed-expert weights. Where the bytes live
// (a checkpoint's mmap, a host bank in some tier, a GPU cache slot) is the implementation's
// business; the MoE block only asks for an expert's three matrices.
#pragma once

#include <cstdint>
#include <span>

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
  // The weights the CPU executor computes from: a copy kept for it (packed: fewer bytes, the
  // same values) where the source holds one beside a bank a GPU reads, else Expert().
  virtual const ExpertWeights& CpuExpert(int64_t layer, int64_t expert) const {
    return Expert(layer, expert);
  }
  // Frees the host memory of these layers' experts, once a device holds its own copy: Expert()
  // of them then gives views with null data that still say what the experts are (dtype, shape,
  // bytes: what a decode step reads is counted from them). Returns the bytes freed; a source
  // whose bytes it does not own frees nothing.
  virtual uint64_t ReleaseHost(std::span<const int64_t> layers) {
    (void)layers;
    return 0;
  }
};

}  // namespace moetier
