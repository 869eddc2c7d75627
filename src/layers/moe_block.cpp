#include "layers/moe_block.h"

namespace moetier {

void MoeBlock(ComputeBackend& backend, const TensorView& router, const RouterOptions& opts,
              int64_t layer, const float* x, int64_t n_tokens, Routing& routing, float* out,
              float* router_logits_out) {
  backend.Route(router, opts, x, n_tokens, routing, router_logits_out);
  backend.Experts().Run(layer, routing, x, out);
}

}  // namespace moetier
