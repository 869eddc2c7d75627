#include "layers/attention.h"

namespace moetier {

void SelfAttention(ComputeBackend& backend, const AttentionWeights& w, const AttentionShape& s,
                   const Rope& rope, int64_t layer, const Batch& batch, KvPool& kv, const float* x,
                   float* out) {
  const int64_t T = batch.n_tokens();
  float* q = backend.Activations(Act::kQ, T, s.n_heads * s.head_dim);
  float* k = backend.Activations(Act::kK, T, s.n_kv_heads * s.head_dim);
  float* v = backend.Activations(Act::kV, T, s.n_kv_heads * s.head_dim);
  float* attn = backend.Activations(Act::kAttn, T, s.n_heads * s.head_dim);
  {
    ScopedPhase phase(backend.phase_times(), Phase::kAttnQkv);
    const MatMulOut qkv[] = {{&w.q, q}, {&w.k, k}, {&w.v, v}};
    backend.MatMul(x, T, qkv);
  }
  backend.Attend(w, s, rope, layer, batch, kv, q, k, v, attn);
  ScopedPhase phase(backend.phase_times(), Phase::kAttnOut);
  const MatMulOut o[] = {{&w.o, out}};
  backend.MatMul(attn, T, o);
}

}  // namespace moetier
