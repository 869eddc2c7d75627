// The routed-expert block: the backend's router (logits → softmax → top-k → the step's tokens
// grouped by expert, a Routing), then its expert executor runs each chosen expert's SwiGLU and
// the weighted sum. The router decides which experts; the executor (experts/) decides where
// they run and never changes which.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace moetier {

// x, out: [n_tokens, d_model] (out overwritten); router: [n_experts, d_model]. If
// router_logits_out is not null it receives the raw router logits [n_tokens, n_experts].
void MoeBlock(ComputeBackend& backend, const TensorView& router, const RouterOptions& opts,
              int64_t layer, const float* x, int64_t n_tokens, float* out,
              float* router_logits_out = nullptr);

}  // namespace moetier
