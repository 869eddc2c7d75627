#include "backend/prefetch_probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/elementwise.h"

namespace moetier {

namespace {

// The n best experts of each row of raw logits [n_tokens, n_experts], best first: softmax, then
// SelectTopK (the router's order, ties to the lower id). ids [n_tokens, n].
void RankExperts(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t n,
                 int32_t* ids) {
  std::vector<float> probs(static_cast<size_t>(n_experts));
  std::vector<float> weights(static_cast<size_t>(n));
  RouterOptions top;
  top.n_experts = n_experts;
  top.top_k = n;
  top.normalize_top_k = false;
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::memcpy(probs.data(), logits + t * n_experts,
                static_cast<size_t>(n_experts) * sizeof(float));
    kernels::SoftmaxRow(probs.data(), n_experts);
    SelectTopK(probs.data(), 1, top, ids + t * n, weights.data());
  }
}

}  // namespace

const char* PrefetchPredictorName(PrefetchPredictor p) {
  switch (p) {
    case PrefetchPredictor::kMoeInput:
      return "moe_input";
    case PrefetchPredictor::kResidual:
      return "residual";
  }
  return "?";
}

double PrefetchCounts::Recall(const Cell& cell, size_t size_index) const {
  if (cell.tokens == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(cell.hits[size_index]) / static_cast<double>(cell.tokens * top_k);
}

double PrefetchCounts::Recall(PrefetchPredictor p, size_t size_index) const {
  Cell sum;
  sum.hits.assign(set_sizes.size(), 0);
  for (const Layer& l : layers) {
    const Cell& c = l.by_predictor[static_cast<size_t>(p)];
    if (c.tokens == 0) continue;
    sum.tokens += c.tokens;
    sum.hits[size_index] += c.hits[size_index];
  }
  return Recall(sum, size_index);
}

int64_t PrefetchCounts::Tokens(PrefetchPredictor p) const {
  int64_t n = 0;
  for (const Layer& l : layers) n += l.by_predictor[static_cast<size_t>(p)].tokens;
  return n;
}

void ChosenExperts(const float* logits, int64_t n_tokens, const RouterOptions& opts, int32_t* ids) {
  RankExperts(logits, n_tokens, opts.n_experts, opts.top_k, ids);
}

void AddPrefetchHits(const float* predicted, const int32_t* chosen, int64_t n_tokens,
                     const RouterOptions& opts, std::span<const int64_t> set_sizes,
                     std::span<int64_t> hits) {
  if (set_sizes.empty()) return;
  const int64_t K = opts.top_k;
  // The best set_sizes.back() in order: each smaller set is a prefix of it.
  const int64_t n_max = set_sizes.back();
  std::vector<int32_t> ranked(static_cast<size_t>(n_tokens * n_max));
  RankExperts(predicted, n_tokens, opts.n_experts, n_max, ranked.data());
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t* best = ranked.data() + t * n_max;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = chosen[t * K + j];
      const int64_t rank = std::find(best, best + n_max, e) - best;  // n_max: not predicted
      for (size_t s = 0; s < set_sizes.size(); ++s)
        if (rank < set_sizes[s]) ++hits[s];
    }
  }
}

PrefetchProbe::PrefetchProbe(std::unique_ptr<ComputeBackend> inner) : inner_(std::move(inner)) {}

PrefetchCounts PrefetchProbe::TakeCounts() {
  PrefetchCounts taken = std::move(counts_);
  counts_ = PrefetchCounts{};
  counts_.top_k = taken.top_k;
  counts_.n_experts = taken.n_experts;
  counts_.set_sizes = taken.set_sizes;
  return taken;
}

void PrefetchProbe::BeginStep(const Batch& batch, const KvPool& kv, StepOutput output) {
  prev_.layer = -2;
  prev_.has_h = prev_.awaits_h = false;
  prev_.out = nullptr;
  last_norm_ = LastNorm{};
  inner_->BeginStep(batch, kv, output);
}

void PrefetchProbe::SeeResidualAdd(const float* x, int64_t n, const float* h) {
  if (!prev_.awaits_h || x != prev_.out) return;
  prev_.awaits_h = false;
  prev_.h.assign(h, h + n);
  prev_.has_h = true;
}

void PrefetchProbe::SeeNorm(const float* y, int64_t n_rows, const std::vector<float>& weight,
                            float eps) {
  last_norm_ = LastNorm{y, n_rows, &weight, eps};
}

void PrefetchProbe::RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
                            const std::vector<float>& weight, float eps, int64_t d, float* y) {
  inner_->RmsNorm(x, n_rows, rows, weight, eps, d, y);
  if (rows.empty())
    SeeNorm(y, n_rows, weight, eps);
  else
    last_norm_ = LastNorm{};  // a selection of rows: no MoE block's input
}

void PrefetchProbe::Add(const float* x, int64_t n, float* y) {
  inner_->Add(x, n, y);
  SeeResidualAdd(x, n, y);
}

void PrefetchProbe::AddRmsNorm(const float* x, int64_t n_rows, float* h,
                               const std::vector<float>& weight, float eps, int64_t d, float* y) {
  inner_->AddRmsNorm(x, n_rows, h, weight, eps, d, y);
  SeeResidualAdd(x, n_rows * d, h);
  SeeNorm(y, n_rows, weight, eps);
}

int64_t PrefetchProbe::AddRmsNormScan(const float* x, int64_t n_rows, float* h,
                                      const std::vector<float>& weight, float eps, int64_t d,
                                      float* y, int64_t slot) {
  const int64_t bad = inner_->AddRmsNormScan(x, n_rows, h, weight, eps, d, y, slot);
  SeeResidualAdd(x, n_rows * d, h);
  SeeNorm(y, n_rows, weight, eps);
  return bad;
}

PrefetchCounts::Layer& PrefetchProbe::CountsFor(int64_t layer) {
  auto it =
      std::lower_bound(counts_.layers.begin(), counts_.layers.end(), layer,
                       [](const PrefetchCounts::Layer& l, int64_t id) { return l.layer < id; });
  if (it == counts_.layers.end() || it->layer != layer) {
    PrefetchCounts::Layer fresh;
    fresh.layer = layer;
    for (PrefetchCounts::Cell& c : fresh.by_predictor) c.hits.assign(counts_.set_sizes.size(), 0);
    it = counts_.layers.insert(it, std::move(fresh));
  }
  return *it;
}

void PrefetchProbe::Moe(const TensorView& router, const RouterOptions& opts, int64_t layer,
                        const float* x, int64_t n_tokens, float* out, float* router_logits) {
  const int64_t T = n_tokens, E = opts.n_experts, H = router.shape.back();
  // The norm whose output this block reads: its weight is the block's input norm.
  const LastNorm input_norm = last_norm_.y == x && last_norm_.n_rows == T ? last_norm_ : LastNorm{};
  float* logits = router_logits;
  if (logits == nullptr) {
    logits_.resize(static_cast<size_t>(T * E));
    logits = logits_.data();
  }
  inner_->Moe(router, opts, layer, x, T, out, logits);

  if (counts_.top_k == 0) {
    counts_.top_k = opts.top_k;
    counts_.n_experts = E;
    counts_.set_sizes = {opts.top_k, std::min(2 * opts.top_k, E)};
  }
  if (prev_.layer == layer - 1 && prev_.n_tokens == T)
    Predict(router, opts, layer, logits, T, input_norm);

  prev_.layer = layer;
  prev_.n_tokens = T;
  prev_.out = out;
  prev_.x.assign(x, x + T * H);
  prev_.has_h = false;
  prev_.awaits_h = true;
}

void PrefetchProbe::Predict(const TensorView& router, const RouterOptions& opts, int64_t layer,
                            const float* logits, int64_t n_tokens, const LastNorm& input_norm) {
  const int64_t T = n_tokens, E = opts.n_experts, H = router.shape.back();
  chosen_.resize(static_cast<size_t>(T * opts.top_k));
  ChosenExperts(logits, T, opts, chosen_.data());
  predicted_.resize(static_cast<size_t>(T * E));
  PrefetchCounts::Layer& counts = CountsFor(layer);
  const MatMulOut target[] = {{&router, predicted_.data()}};

  PrefetchCounts::Cell& from_x =
      counts.by_predictor[static_cast<size_t>(PrefetchPredictor::kMoeInput)];
  inner_->MatMul(prev_.x.data(), T, target);
  AddPrefetchHits(predicted_.data(), chosen_.data(), T, opts, counts_.set_sizes, from_x.hits);
  from_x.tokens += T;

  if (!prev_.has_h || input_norm.weight == nullptr) return;
  PrefetchCounts::Cell& from_h =
      counts.by_predictor[static_cast<size_t>(PrefetchPredictor::kResidual)];
  normed_.resize(static_cast<size_t>(T * H));
  inner_->RmsNorm(prev_.h.data(), T, {}, *input_norm.weight, input_norm.eps, H, normed_.data());
  inner_->MatMul(normed_.data(), T, target);
  AddPrefetchHits(predicted_.data(), chosen_.data(), T, opts, counts_.set_sizes, from_h.hits);
  from_h.tokens += T;
}

}  // namespace moetier
