// SwiGLU feed-forward pieces shared by dense MLP layers and routed experts.
#pragma once

#include <cstdint>

#include "layers/workspace.h"
#include "ops/expert_source.h"

namespace moetier {

// out[n_tokens, d_model] = down · (silu(gate · x) ⊙ (up · x)) for x: [n_tokens, d_model].
void SwiGlu(Workspace& ws, const ExpertWeights& w, const float* x, int64_t n_tokens, float* out);

}  // namespace moetier
