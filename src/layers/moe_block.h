// The routed-expert block: router logits → softmax → top-k (renormalised or not) → each chosen
// expert's SwiGLU → sum weighted by the routing weights. Experts come from an ExpertSource, so
// this block never knows where their bytes live.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "layers/workspace.h"
#include "ops/expert_source.h"

namespace moetier {

struct RouterOptions {
  int64_t n_experts = 0;
  int64_t top_k = 0;
  bool normalize_top_k = true;  // divide the chosen weights by their sum
};

// For each token, the top_k experts by routing probability (highest first; on equal
// probability the lower expert id first) and their weights. probs: [n_tokens, n_experts]
// softmax outputs; ids/weights: [n_tokens, top_k].
void SelectTopK(const float* probs, int64_t n_tokens, const RouterOptions& opts, int32_t* ids,
                float* weights);

// x: [n_tokens, d_model]; router: [n_experts, d_model]; out: [n_tokens, d_model] (overwritten).
// If router_logits_out is not null it receives the raw router logits [n_tokens, n_experts].
void MoeBlock(Workspace& ws, const TensorView& router, const RouterOptions& opts,
              const ExpertSource& experts, int64_t layer, const float* x, int64_t n_tokens,
              int64_t d_model, float* out, float* router_logits_out = nullptr);

}  // namespace moetier
