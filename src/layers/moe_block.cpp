#include "layers/moe_block.h"

namespace moetier {

void MoeBlock(ComputeBackend& backend, const TensorView& router, const RouterOptions& opts,
              int64_t layer, const float* x, int64_t n_tokens, float* out,
              float* router_logits_out) {
  backend.Moe(router, opts, layer, x, n_tokens, out, router_logits_out);
}

}  // namespace moetier
