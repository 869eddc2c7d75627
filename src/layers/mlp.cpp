#include "layers/mlp.h"

namespace moetier {

void SwiGlu(ComputeBackend& backend, const ExpertWeights& w, const float* x, int64_t n_tokens,
            float* out) {
  const int64_t width = w.gate.shape.front();
  float* gate = backend.Activations(Act::kGate, n_tokens, width);
  float* up = backend.Activations(Act::kUp, n_tokens, width);
  const MatMulOut gate_up[] = {{&w.gate, gate}, {&w.up, up}};
  backend.MatMul(x, n_tokens, gate_up);
  backend.SiluMul(gate, up, n_tokens * width);
  const MatMulOut down[] = {{&w.down, out}};
  backend.MatMul(gate, n_tokens, down);
}

}  // namespace moetier
