#include "layers/attention.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"

namespace moetier {

namespace {

void AddBias(float* x, int64_t n_tokens, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const int64_t n = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < n; ++i) x[t * n + i] += bias[static_cast<size_t>(i)];
}

void HeadNorm(float* x, int64_t n_rows, const std::vector<float>& weight, int64_t head_dim,
              float eps) {
  if (weight.empty()) return;
  for (int64_t r = 0; r < n_rows; ++r)
    kernels::RmsNormRow(x + r * head_dim, weight.data(), eps, head_dim, x + r * head_dim);
}

}  // namespace

void CausalAttention(ThreadPool& pool, const float* q, int64_t n_tokens, int64_t pos0,
                     const float* keys, const float* values, const AttentionShape& s, float* out) {
  const int64_t group = s.n_heads / s.n_kv_heads;
  const int64_t kv_row = s.n_kv_heads * s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  pool.ParallelFor(static_cast<size_t>(n_tokens * s.n_heads), [&](size_t begin, size_t end, int) {
    thread_local std::vector<float> scores;
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = static_cast<int64_t>(item) / s.n_heads;
      const int64_t h = static_cast<int64_t>(item) % s.n_heads;
      const int64_t kvh = h / group;
      const int64_t pos = pos0 + t;
      const int64_t first =
          s.sliding_window > 0 && pos >= s.sliding_window ? pos - s.sliding_window + 1 : 0;
      const int64_t n_keys = pos - first + 1;
      if (scores.size() < static_cast<size_t>(n_keys)) scores.resize(static_cast<size_t>(n_keys));
      const float* qh = q + (t * s.n_heads + h) * s.head_dim;
      for (int64_t j = 0; j < n_keys; ++j)
        scores[static_cast<size_t>(j)] =
            kernels::DotF32(qh, keys + (first + j) * kv_row + kvh * s.head_dim, s.head_dim) * scale;
      kernels::SoftmaxRow(scores.data(), n_keys);
      float* o = out + (t * s.n_heads + h) * s.head_dim;
      std::memset(o, 0, static_cast<size_t>(s.head_dim) * sizeof(float));
      for (int64_t j = 0; j < n_keys; ++j)
        kernels::Axpy(scores[static_cast<size_t>(j)],
                      values + (first + j) * kv_row + kvh * s.head_dim, s.head_dim, o);
    }
  });
}

void SelfAttention(Workspace& ws, const AttentionWeights& w, const AttentionShape& s,
                   const Rope& rope, int64_t layer, KvCache& cache, const float* x,
                   int64_t n_tokens, float* out) {
  const int64_t q_width = s.n_heads * s.head_dim;
  const int64_t kv_width = s.n_kv_heads * s.head_dim;
  const size_t T = static_cast<size_t>(n_tokens);
  float* q = ws.Get(Scratch::kQ, T * static_cast<size_t>(q_width));
  float* k = ws.Get(Scratch::kK, T * static_cast<size_t>(kv_width));
  float* v = ws.Get(Scratch::kV, T * static_cast<size_t>(kv_width));
  ThreadPool& pool = ws.pool();
  ScopedPhase phase(ws.times(), Phase::kAttnQkv);
  const kernels::MatMulTarget qkv[] = {{&w.q, q}, {&w.k, k}, {&w.v, v}};
  kernels::MatMulBatch(pool, x, n_tokens, qkv, 3);
  phase.Switch(Phase::kAttention);
  AddBias(q, n_tokens, w.q_bias);
  AddBias(k, n_tokens, w.k_bias);
  AddBias(v, n_tokens, w.v_bias);
  HeadNorm(q, n_tokens * s.n_heads, w.q_norm, s.head_dim, s.norm_eps);
  HeadNorm(k, n_tokens * s.n_kv_heads, w.k_norm, s.head_dim, s.norm_eps);
  const int64_t pos0 = cache.n_past();
  rope.Apply(q, n_tokens, s.n_heads, pos0);
  rope.Apply(k, n_tokens, s.n_kv_heads, pos0);

  // The cache holds exactly the rows attention reads: this step's rows go in first.
  std::memcpy(cache.keys(layer) + pos0 * kv_width, k, T * static_cast<size_t>(kv_width) * 4);
  std::memcpy(cache.values(layer) + pos0 * kv_width, v, T * static_cast<size_t>(kv_width) * 4);

  float* attn = ws.Get(Scratch::kAttnOut, T * static_cast<size_t>(q_width));
  CausalAttention(pool, q, n_tokens, pos0, cache.keys(layer), cache.values(layer), s, attn);
  phase.Switch(Phase::kAttnOut);
  kernels::MatMul(pool, attn, n_tokens, w.o, out);
}

}  // namespace moetier
