#include "backend/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/tuning.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"

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

namespace {

// Scratch of one attention thread, grown to the longest context seen and kept: scores, the runs
// of rows (a paged cache's blocks), and float copies of bf16/f16 rows.
struct AttentionScratch {
  std::vector<float> scores;         // [heads per task, n_keys]
  std::vector<kernels::KvRun> runs;  // one per block
  std::vector<float> keys, values;   // [n_keys, head_dim] when the cache is not f32

  // Sizes round up to kScratchKeys keys, so a decode step at position p + 1 does not grow
  // what position p needed.
  static constexpr size_t kScratchKeys = 1024;
  static size_t Rounded(size_t n) { return (n + kScratchKeys - 1) / kScratchKeys * kScratchKeys; }
  template <typename T>
  static T* Fit(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(Rounded(n));
    return v.data();
  }
};

void ToFloat(const uint8_t* rows, DType dtype, int64_t n_rows, int64_t stride, int64_t d,
             float* out) {
  const auto* h = reinterpret_cast<const uint16_t*>(rows);
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < d; ++i)
      out[r * d + i] =
          dtype == DType::kBF16 ? Bf16ToF32(h[r * stride + i]) : F16ToF32(h[r * stride + i]);
}

// The runs of key/value rows of head `kvh` for positions [first, last] of the sequence with
// block table `blocks`: pointers into an f32 pool (rows kv_row apart), or, for bf16/f16, rows
// converted into the scratch (head_dim apart). Returns the row stride.
int64_t GatherRuns(const KvPool& kv, int64_t layer, std::span<const int32_t> blocks, int64_t first,
                   int64_t last, int64_t kvh, AttentionScratch& sc) {
  const int64_t B = kv.block_size(), row = kv.shape().row(), d = kv.shape().head_dim;
  const int64_t n_keys = last - first + 1;
  const int64_t n_runs = last / B - first / B + 1;
  kernels::KvRun* runs = AttentionScratch::Fit(sc.runs, static_cast<size_t>(n_runs));
  const bool f32 = kv.dtype() == DType::kF32;
  float* kf = f32 ? nullptr : AttentionScratch::Fit(sc.keys, static_cast<size_t>(n_keys * d));
  float* vf = f32 ? nullptr : AttentionScratch::Fit(sc.values, static_cast<size_t>(n_keys * d));
  const size_t elt = DTypeSize(kv.dtype());
  int64_t done = 0;
  for (int64_t r = 0; r < n_runs; ++r) {
    const int64_t p = first + done;
    const int64_t block = blocks[static_cast<size_t>(p / B)];
    const int64_t slot = p % B;
    const int64_t n = std::min(B - slot, n_keys - done);
    const size_t offset = static_cast<size_t>(slot * row + kvh * d) * elt;
    const uint8_t* k = kv.keys(block, layer) + offset;
    const uint8_t* v = kv.values(block, layer) + offset;
    if (f32) {
      runs[r] = {reinterpret_cast<const float*>(k), reinterpret_cast<const float*>(v), n};
    } else {
      ToFloat(k, kv.dtype(), n, row, d, kf + done * d);
      ToFloat(v, kv.dtype(), n, row, d, vf + done * d);
      runs[r] = {kf + done * d, vf + done * d, n};
    }
    done += n;
  }
  return f32 ? row : d;
}

}  // namespace

void CausalAttention(ThreadPool& pool, float* q, const Batch& batch, const KvPool& kv,
                     int64_t layer, const AttentionShape& s, float* out,
                     const QueryPrologue* prologue) {
  const int64_t n_tokens = batch.n_tokens();
  const int64_t group = s.n_heads / s.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t per_task =
      AttentionHeadsPerTask(n_tokens, s.n_kv_heads, group, static_cast<int>(pool.size()));
  const int64_t chunks = (group + per_task - 1) / per_task;  // tasks per (token, kv head)
  auto first_of = [&](int64_t pos) {
    return s.sliding_window > 0 && pos >= s.sliding_window ? pos - s.sliding_window + 1 : 0;
  };
  pool.ParallelFor(static_cast<size_t>(n_tokens * s.n_kv_heads * chunks), [&](size_t begin,
                                                                              size_t end, int) {
    thread_local AttentionScratch scratch;
    for (size_t item = begin; item < end; ++item) {
      const int64_t i = static_cast<int64_t>(item);
      const int64_t t = i / (s.n_kv_heads * chunks);
      const int64_t kvh = i / chunks % s.n_kv_heads;
      const int64_t h0 = kvh * group + i % chunks * per_task;
      const int64_t n_q = std::min(per_task, (kvh + 1) * group - h0);
      const int64_t pos = batch.positions[static_cast<size_t>(t)];
      const int64_t first = first_of(pos);
      const int64_t n_keys = pos - first + 1;
      float* qt = q + (t * s.n_heads + h0) * s.head_dim;
      if (prologue != nullptr) {
        if (prologue->norm != nullptr)
          HeadNorm(qt, n_q, *prologue->norm, s.head_dim, prologue->eps);
        prologue->rope->Rotate(qt, n_q, prologue->angles + t * s.head_dim);
      }
      const auto blocks =
          batch.block_tables[static_cast<size_t>(batch.seq_of[static_cast<size_t>(t)])];
      const int64_t stride = GatherRuns(kv, layer, blocks, first, pos, kvh, scratch);
      const int64_t n_runs = pos / kv.block_size() - first / kv.block_size() + 1;
      float* scores = AttentionScratch::Fit(scratch.scores, static_cast<size_t>(per_task * n_keys));
      kernels::AttendSharedKvRuns(
          qt, n_q, s.head_dim,
          std::span<const kernels::KvRun>(scratch.runs.data(), static_cast<size_t>(n_runs)), stride,
          s.head_dim, scale, scores, out + (t * s.n_heads + h0) * s.head_dim, s.head_dim);
    }
  });
}

void AttendCpu(ThreadPool& pool, PhaseTimes* times, Workspace& ws, const AttentionWeights& w,
               const AttentionShape& s, const Rope& rope, int64_t layer, const Batch& batch,
               KvPool& kv, float* q, float* k, float* v, float* out) {
  const int64_t n_tokens = batch.n_tokens();
  const int64_t kv_width = s.n_kv_heads * s.head_dim;
  const size_t T = static_cast<size_t>(n_tokens);
  ScopedPhase phase(times, Phase::kAttention);
  AddBias(q, n_tokens, w.q_bias);
  AddBias(k, n_tokens, w.k_bias);
  AddBias(v, n_tokens, w.v_bias);
  // Keys are normed and rotated here (attention tasks of several query-head slices read them);
  // each query head by the task that uses it (QueryPrologue).
  HeadNorm(k, n_tokens * s.n_kv_heads, w.k_norm, s.head_dim, s.norm_eps);
  float* angles = ws.Get(Scratch::kRope, T * static_cast<size_t>(s.head_dim));
  rope.Angles(batch.positions, angles);
  for (int64_t t = 0; t < n_tokens; ++t)
    rope.Rotate(k + t * kv_width, s.n_kv_heads, angles + t * s.head_dim);

  // The cache holds exactly the rows attention reads: this step's rows go in first.
  const int64_t B = kv.block_size();
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t pos = batch.positions[static_cast<size_t>(t)];
    const auto blocks =
        batch.block_tables[static_cast<size_t>(batch.seq_of[static_cast<size_t>(t)])];
    kv.WriteRows(blocks[static_cast<size_t>(pos / B)], layer, pos % B, 1, k + t * kv_width,
                 v + t * kv_width);
  }
  const QueryPrologue prologue{&w.q_norm, s.norm_eps, &rope, angles};
  CausalAttention(pool, q, batch, kv, layer, s, out, &prologue);
}

}  // namespace moetier
