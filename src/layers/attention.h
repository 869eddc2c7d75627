// Self-attention sublayer: q/k/v projections (one batched product), the backend's attention
// core over the paged KV cache (biases, per-head q/k RMSNorm, RoPE, cache append, causal
// grouped-query attention), output projection.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace moetier {

// x: [batch.n_tokens(), d_model], token t at batch.positions[t] of its sequence; out: the same
// shape (overwritten). Writes this layer's K/V rows of every token into `kv` first, so tokens of
// one sequence in the batch (a prompt chunk) see each other causally.
void SelfAttention(ComputeBackend& backend, const AttentionWeights& w, const AttentionShape& shape,
                   const Rope& rope, int64_t layer, const Batch& batch, KvPool& kv, const float* x,
                   float* out);

}  // namespace moetier
