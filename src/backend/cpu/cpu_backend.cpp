#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cpu/paged_attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"

namespace moetier {

CpuBackend::CpuBackend(int n_threads, const ExpertSource& experts, int64_t d_model)
    : pool_(n_threads), ws_(pool_), executor_(experts, pool_, d_model) {}

float* CpuBackend::Activations(Act slot, int64_t n_tokens, int64_t width) {
  auto& b = acts_[static_cast<size_t>(slot)];
  const size_t n = static_cast<size_t>(n_tokens * width);
  if (b.size() < n) b.resize(n);
  return b.data();
}

void CpuBackend::Embed(const TensorView& table, std::span<const int32_t> tokens, float* h) {
  const int64_t d = table.shape.back();
  for (size_t t = 0; t < tokens.size(); ++t)
    kernels::RowToF32(table, static_cast<int64_t>(tokens[t]) * d, d,
                      h + static_cast<int64_t>(t) * d);
}

void CpuBackend::RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
                         const std::vector<float>& weight, float eps, int64_t d, float* y) {
  if (rows.empty()) {
    for (int64_t r = 0; r < n_rows; ++r)
      kernels::RmsNormRow(x + r * d, weight.data(), eps, d, y + r * d);
    return;
  }
  for (size_t i = 0; i < rows.size(); ++i)
    kernels::RmsNormRow(x + static_cast<int64_t>(rows[i]) * d, weight.data(), eps, d,
                        y + static_cast<int64_t>(i) * d);
}

void CpuBackend::Add(const float* x, int64_t n, float* y) {
  kernels::Axpy(1.0f, x, n, y);
}

void CpuBackend::MatMul(const float* x, int64_t n_tokens, std::span<const MatMulOut> targets) {
  // Groups of up to kMaxTargets share one preparation of x (attention's q/k/v are three).
  constexpr size_t kMaxTargets = 4;
  kernels::MatMulTarget t[kMaxTargets];
  for (size_t first = 0; first < targets.size(); first += kMaxTargets) {
    const size_t n = std::min(kMaxTargets, targets.size() - first);
    if (n == 1) {
      kernels::MatMul(pool_, x, n_tokens, *targets[first].w, targets[first].y);
      continue;
    }
    for (size_t i = 0; i < n; ++i) t[i] = {targets[first + i].w, targets[first + i].y};
    kernels::MatMulBatch(pool_, x, n_tokens, t, n);
  }
}

void CpuBackend::SiluMul(float* gate, const float* up, int64_t n) {
  kernels::SiluMul(gate, up, n);
}

void CpuBackend::Attend(const AttentionWeights& w, const AttentionShape& shape, const Rope& rope,
                        int64_t layer, const Batch& batch, KvPool& kv, float* q, float* k, float* v,
                        float* out) {
  AttendCpu(pool_, times_, ws_, w, shape, rope, layer, batch, kv, q, k, v, out);
}

void CpuBackend::Route(const TensorView& router, const RouterOptions& opts, const float* x,
                       int64_t n_tokens, Routing& routing, float* router_logits_out) {
  const int64_t E = opts.n_experts;
  const int64_t K = opts.top_k;
  const size_t T = static_cast<size_t>(n_tokens);
  float* probs = ws_.Get(Scratch::kRouter, T * static_cast<size_t>(E));
  ScopedPhase phase(times_, Phase::kRouter);
  kernels::MatMul(pool_, x, n_tokens, router, probs);
  phase.Switch(Phase::kRouting);
  if (router_logits_out != nullptr)
    std::memcpy(router_logits_out, probs, T * static_cast<size_t>(E) * sizeof(float));
  for (int64_t t = 0; t < n_tokens; ++t) kernels::SoftmaxRow(probs + t * E, E);

  const size_t n_assign = T * static_cast<size_t>(K);
  std::vector<int32_t>& ids = ws_.ints(0);
  ids.resize(n_assign);
  float* route_weight = ws_.Get(Scratch::kRouteWeight, n_assign);
  SelectTopK(probs, n_tokens, opts, ids.data(), route_weight);

  routing.Group(ids.data(), route_weight, n_tokens, K, E, ws_.ints(1));
}

void CpuBackend::Moe(const TensorView& router, const RouterOptions& opts, int64_t layer,
                     const float* x, int64_t n_tokens, float* out, float* router_logits) {
  Route(router, opts, x, n_tokens, routing_, router_logits);
  executor_.Run(layer, routing_, x, out);
  const auto n_active = static_cast<int64_t>(routing_.n_active());
  active_experts_ += n_active;
  if (stats_ != nullptr) {
    LayerExpertStats d;
    d.layer = layer;
    d.calls = 1;
    d.active_experts = d.cpu_experts = n_active;
    d.assignments = static_cast<int64_t>(routing_.n_assignments());
    stats_->Add(d);
  }
}

int64_t CpuBackend::ScanNonFinite(const float* x, int64_t n, int64_t slot) {
  const int64_t first = kernels::FirstNonFinite(x, n);
  if (non_finite_.size() <= static_cast<size_t>(slot))
    non_finite_.resize(static_cast<size_t>(slot) + 1, -1);
  non_finite_[static_cast<size_t>(slot)] = first;
  return first;
}

void CpuBackend::BeginStep(const Batch& batch, const KvPool&, StepOutput) {
  non_finite_.clear();
  scored_.assign(batch.scored.begin(), batch.scored.end());
}

void CpuBackend::Logits(const float* x, int64_t n_rows, const TensorView& lm_head, float* logits) {
  const MatMulOut head[] = {{&lm_head, logits}};
  MatMul(x, n_rows, head);
}

void CpuBackend::ArgMaxLogits(const float* x, int64_t n_rows, const TensorView& lm_head,
                              int32_t* ids, int64_t scan_slot) {
  const int64_t vocab = lm_head.dim(0);
  KeepLogits(x, n_rows, lm_head);
  for (int64_t r = 0; r < n_rows; ++r)
    ids[r] = static_cast<int32_t>(kernels::ArgMax(kept_logits_.data() + r * vocab, vocab));
  ScanNonFinite(kept_logits_.data(), n_rows * vocab, scan_slot);
}

void CpuBackend::TopKLogits(const float* x, int64_t n_rows, const TensorView& lm_head,
                            LogitCandidate* cands, int32_t* counts, RowLogSum* sums,
                            int64_t scan_slot) {
  const int64_t vocab = lm_head.dim(0);
  KeepLogits(x, n_rows, lm_head);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* row = kept_logits_.data() + r * vocab;
    counts[r] = kernels::TopKCandidates(row, vocab, kMaxCandidateTopK, kMaxLogitCandidates,
                                        cands + r * kMaxLogitCandidates);
    if (sums == nullptr) continue;
    const int32_t token =
        static_cast<size_t>(r) < scored_.size() ? scored_[static_cast<size_t>(r)] : -1;
    RowLogSum& sum = sums[r];
    sum.log_sum_exp = kernels::LogSumExp(row, vocab);
    sum.token = token >= 0 && token < vocab ? token : -1;
    sum.token_logit = sum.token >= 0 ? row[sum.token] : std::numeric_limits<float>::quiet_NaN();
  }
  ScanNonFinite(kept_logits_.data(), n_rows * vocab, scan_slot);
}

void CpuBackend::KeepLogits(const float* x, int64_t n_rows, const TensorView& lm_head) {
  kept_vocab_ = lm_head.dim(0);
  kept_logits_.resize(static_cast<size_t>(n_rows * kept_vocab_));
  Logits(x, n_rows, lm_head, kept_logits_.data());
}

Status CpuBackend::CopyLogitsRow(int64_t r, float* out) {
  const auto v = static_cast<size_t>(kept_vocab_);
  if (r < 0 || (static_cast<size_t>(r) + 1) * v > kept_logits_.size())
    return Status::Error("no logits row " + std::to_string(r) + " kept from the last step");
  std::copy_n(kept_logits_.data() + static_cast<size_t>(r) * v, v, out);
  return OkStatus();
}

void CpuBackend::SetPhaseTimes(PhaseTimes* times) {
  times_ = times;
  ws_.set_times(times);
  executor_.SetPhaseTimes(times);
}

}  // namespace moetier
