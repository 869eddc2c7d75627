#include "layers/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/tuning.h"
#include "kernels/cpu/attention.h"
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

int64_t AttentionHeadsPerTask(int64_t n_tokens, int64_t n_kv_heads, int64_t group, int threads) {
  if (const auto forced = Tuning().attn_heads_per_task) return std::min(*forced, group);
  int64_t h = group;
  const auto tasks = [&](int64_t per) { return n_tokens * n_kv_heads * ((group + per - 1) / per); };
  while (h > kMinAttnHeadsPerTask && tasks(h) < kAttnTasksPerThread * threads)
    h = std::max(kMinAttnHeadsPerTask, (h + 1) / 2);
  return h;
}

void CausalAttention(ThreadPool& pool, float* q, int64_t n_tokens, int64_t pos0, const float* keys,
                     const float* values, const AttentionShape& s, int64_t key_capacity, float* out,
                     const QueryPrologue* prologue) {
  const int64_t group = s.n_heads / s.n_kv_heads;
  const int64_t kv_row = s.n_kv_heads * s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t per_task =
      AttentionHeadsPerTask(n_tokens, s.n_kv_heads, group, static_cast<int>(pool.size()));
  const int64_t chunks = (group + per_task - 1) / per_task;  // tasks per (token, kv head)
  const size_t need = static_cast<size_t>(per_task * std::max(key_capacity, pos0 + n_tokens));
  pool.ParallelFor(
      static_cast<size_t>(n_tokens * s.n_kv_heads * chunks), [&](size_t begin, size_t end, int) {
        thread_local std::vector<float> scores;
        if (scores.size() < need) scores.resize(need);
        for (size_t item = begin; item < end; ++item) {
          const int64_t i = static_cast<int64_t>(item);
          const int64_t t = i / (s.n_kv_heads * chunks);
          const int64_t kvh = i / chunks % s.n_kv_heads;
          const int64_t h0 = kvh * group + i % chunks * per_task;
          const int64_t n_q = std::min(per_task, (kvh + 1) * group - h0);
          const int64_t pos = pos0 + t;
          const int64_t first =
              s.sliding_window > 0 && pos >= s.sliding_window ? pos - s.sliding_window + 1 : 0;
          const int64_t n_keys = pos - first + 1;
          float* qt = q + (t * s.n_heads + h0) * s.head_dim;
          if (prologue != nullptr) {
            if (prologue->norm != nullptr)
              HeadNorm(qt, n_q, *prologue->norm, s.head_dim, prologue->eps);
            prologue->rope->Rotate(qt, n_q, prologue->angles + t * s.head_dim);
          }
          const int64_t head_offset = first * kv_row + kvh * s.head_dim;
          kernels::AttendSharedKv(qt, n_q, s.head_dim, keys + head_offset, values + head_offset,
                                  kv_row, n_keys, s.head_dim, scale, scores.data(),
                                  out + (t * s.n_heads + h0) * s.head_dim, s.head_dim);
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
  // Keys are normed and rotated here (attention tasks of several query-head slices read them);
  // each query head by the task that uses it (QueryPrologue).
  HeadNorm(k, n_tokens * s.n_kv_heads, w.k_norm, s.head_dim, s.norm_eps);
  const int64_t pos0 = cache.n_past();
  float* angles = ws.Get(Scratch::kRope, T * static_cast<size_t>(s.head_dim));
  rope.Angles(pos0, n_tokens, angles);
  for (int64_t t = 0; t < n_tokens; ++t)
    rope.Rotate(k + t * kv_width, s.n_kv_heads, angles + t * s.head_dim);

  // The cache holds exactly the rows attention reads: this step's rows go in first.
  std::memcpy(cache.keys(layer) + pos0 * kv_width, k, T * static_cast<size_t>(kv_width) * 4);
  std::memcpy(cache.values(layer) + pos0 * kv_width, v, T * static_cast<size_t>(kv_width) * 4);

  float* attn = ws.Get(Scratch::kAttnOut, T * static_cast<size_t>(q_width));
  const QueryPrologue prologue{&w.q_norm, s.norm_eps, &rope, angles};
  CausalAttention(pool, q, n_tokens, pos0, cache.keys(layer), cache.values(layer), s,
                  cache.capacity(), attn, &prologue);
  phase.Switch(Phase::kAttnOut);
  kernels::MatMul(pool, attn, n_tokens, w.o, out);
}

}  // namespace moetier
