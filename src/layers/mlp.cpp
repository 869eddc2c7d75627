#include "layers/mlp.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"

namespace moetier {

void SwiGlu(Workspace& ws, const ExpertWeights& w, const float* x, int64_t n_tokens, float* out) {
  const int64_t width = w.gate.shape.front();
  const size_t n = static_cast<size_t>(n_tokens * width);
  float* gate = ws.Get(Scratch::kGate, n);
  float* up = ws.Get(Scratch::kUp, n);
  const kernels::MatMulTarget gate_up[] = {{&w.gate, gate}, {&w.up, up}};
  kernels::MatMulBatch(ws.pool(), x, n_tokens, gate_up, 2);
  kernels::SiluMul(gate, up, n_tokens * width);
  kernels::MatMul(ws.pool(), gate, n_tokens, w.down, out);
}

}  // namespace moetier
