// SwiGLU feed-forward: a dense MLP layer's out = down · (silu(gate · x) ⊙ (up · x)).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "ops/expert_source.h"

namespace moetier {

// x, out: [n_tokens, d_model] (out overwritten).
void SwiGlu(ComputeBackend& backend, const ExpertWeights& w, const float* x, int64_t n_tokens,
            float* out);

}  // namespace moetier
