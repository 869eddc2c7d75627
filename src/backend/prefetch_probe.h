// PrefetchProbe: how well a MoE layer's routed experts can be known one layer early, so that
// they could be copied toward where they run while the layer before still computes. A predictor
// applies layer L+1's router to what layer L already has:
//   kMoeInput: x_L, the normed input of layer L's MoE block;
//   kResidual: RmsNorm(h_L) · w_{L+1}, h_L the residual stream after layer L and w_{L+1} layer
//              L+1's post-attention norm: x_{L+1} without layer L+1's attention.
// For every token and every MoE layer L+1 that follows a MoE layer L, it counts how many of the
// top_k experts L+1's router chose are among each predictor's n best experts, for each n of
// PrefetchCounts::set_sizes (top_k, and 2 top_k capped at n_experts), ranked as the router ranks
// them (softmax, ties to the lower id: SelectTopK).
//
// The probe is a ComputeBackend that forwards every call to another one, so the model computes
// exactly what it would without it, and watches the Moe and norm calls go by. It reads
// activations through their pointers: the inner backend must keep them in host memory (the
// CPU's). It follows DecoderLM's order of calls: a MoE block's input is the output of the norm
// call just before its Moe call (that norm's weight is then the post-attention norm), and the
// first add of a Moe call's output into the residual leaves h_L; a step that does not follow
// that order counts no kResidual hits. Its cost per MoE layer and step: one router product per
// predictor (n_tokens x n_experts x d_model) and copies of x and h.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace moetier {

enum class PrefetchPredictor : size_t { kMoeInput, kResidual };
inline constexpr size_t kPrefetchPredictors = 2;
// "moe_input", "residual".
const char* PrefetchPredictorName(PrefetchPredictor p);

// Hits counted since the probe's last TakeCounts.
struct PrefetchCounts {
  struct Cell {
    int64_t tokens = 0;         // tokens predicted (each chose top_k experts)
    std::vector<int64_t> hits;  // [set_sizes.size()]: chosen experts in the predicted set
  };
  struct Layer {
    int64_t layer = 0;  // the predicted layer, L+1
    std::array<Cell, kPrefetchPredictors> by_predictor;
  };

  int64_t top_k = 0;
  int64_t n_experts = 0;
  std::vector<int64_t> set_sizes;  // top_k, then min(2 top_k, n_experts)
  std::vector<Layer> layers;       // ascending layer ids

  // hits / (tokens x top_k) of one cell, or over every layer's (NaN when no token was counted).
  double Recall(const Cell& cell, size_t size_index) const;
  double Recall(PrefetchPredictor p, size_t size_index) const;
  int64_t Tokens(PrefetchPredictor p) const;  // summed over layers
};

// The top_k experts a router with `opts` chooses from its raw logits [n_tokens, n_experts]:
// ids [n_tokens, top_k] as the CPU backend's Route chooses them (softmax, SelectTopK).
void ChosenExperts(const float* logits, int64_t n_tokens, const RouterOptions& opts, int32_t* ids);

// Adds to hits[s], for each of n_tokens rows, how many of the row's chosen experts
// (chosen [n_tokens, top_k]) are among the set_sizes[s] best of `predicted` (raw logits
// [n_tokens, n_experts], ranked as ChosenExperts ranks). set_sizes non-decreasing, each in
// [1, n_experts]; hits.size() == set_sizes.size().
void AddPrefetchHits(const float* predicted, const int32_t* chosen, int64_t n_tokens,
                     const RouterOptions& opts, std::span<const int64_t> set_sizes,
                     std::span<int64_t> hits);

class PrefetchProbe final : public ComputeBackend {
 public:
  explicit PrefetchProbe(std::unique_ptr<ComputeBackend> inner);

  // The hits counted since the last call (or since construction); counting starts afresh.
  PrefetchCounts TakeCounts();

  Status Hold(std::span<const TensorView* const> matrices,
              std::span<const std::vector<float>* const> vectors) override {
    return inner_->Hold(matrices, vectors);
  }
  std::vector<int64_t> LayersWithOwnExperts() const override {
    return inner_->LayersWithOwnExperts();
  }
  uint64_t KvMemoryFree() const override { return inner_->KvMemoryFree(); }
  Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) override {
    return inner_->AllocateKv(n_bytes);
  }
  void BeginStep(const Batch& batch, const KvPool& kv, StepOutput output) override;
  float* Activations(Act slot, int64_t n_tokens, int64_t width) override {
    return inner_->Activations(slot, n_tokens, width);
  }
  void Embed(const TensorView& table, std::span<const int32_t> tokens, float* h) override {
    inner_->Embed(table, tokens, h);
  }
  void RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
               const std::vector<float>& weight, float eps, int64_t d, float* y) override;
  void Add(const float* x, int64_t n, float* y) override;
  void AddRmsNorm(const float* x, int64_t n_rows, float* h, const std::vector<float>& weight,
                  float eps, int64_t d, float* y) override;
  int64_t AddRmsNormScan(const float* x, int64_t n_rows, float* h, const std::vector<float>& weight,
                         float eps, int64_t d, float* y, int64_t slot) override;
  void MatMul(const float* x, int64_t n_tokens, std::span<const MatMulOut> targets) override {
    inner_->MatMul(x, n_tokens, targets);
  }
  void SiluMul(float* gate, const float* up, int64_t n) override { inner_->SiluMul(gate, up, n); }
  void Attend(const AttentionWeights& w, const AttentionShape& shape, const Rope& rope,
              int64_t layer, const Batch& batch, KvPool& kv, float* q, float* k, float* v,
              float* out) override {
    inner_->Attend(w, shape, rope, layer, batch, kv, q, k, v, out);
  }
  void Moe(const TensorView& router, const RouterOptions& opts, int64_t layer, const float* x,
           int64_t n_tokens, float* out, float* router_logits) override;
  int64_t TakeActiveExperts() override { return inner_->TakeActiveExperts(); }
  int64_t ScanNonFinite(const float* x, int64_t n, int64_t slot) override {
    return inner_->ScanNonFinite(x, n, slot);
  }
  std::span<const int64_t> NonFiniteScans() override { return inner_->NonFiniteScans(); }
  Status EndStep() override { return inner_->EndStep(); }
  void Logits(const float* x, int64_t n_rows, const TensorView& lm_head, float* logits) override {
    inner_->Logits(x, n_rows, lm_head, logits);
  }
  void ArgMaxLogits(const float* x, int64_t n_rows, const TensorView& lm_head, int32_t* ids,
                    int64_t scan_slot) override {
    inner_->ArgMaxLogits(x, n_rows, lm_head, ids, scan_slot);
  }
  void TopKLogits(const float* x, int64_t n_rows, const TensorView& lm_head, LogitCandidate* cands,
                  int32_t* counts, RowLogSum* sums, int64_t scan_slot) override {
    inner_->TopKLogits(x, n_rows, lm_head, cands, counts, sums, scan_slot);
  }
  Status CopyLogitsRow(int64_t r, float* out) override { return inner_->CopyLogitsRow(r, out); }
  bool SelectsTopK() const override { return inner_->SelectsTopK(); }
  void SetPhaseTimes(PhaseTimes* times) override { inner_->SetPhaseTimes(times); }
  PhaseTimes* phase_times() const override { return inner_->phase_times(); }
  void SetExpertStats(ExpertStats* stats) override { inner_->SetExpertStats(stats); }
  void ExpectRouterLogits(bool expect) override { inner_->ExpectRouterLogits(expect); }
  int64_t ReplayedSteps() const override { return inner_->ReplayedSteps(); }

 private:
  // The last norm call's output and weight: the next Moe call's input norm when it reads y.
  struct LastNorm {
    const float* y = nullptr;
    int64_t n_rows = 0;
    const std::vector<float>* weight = nullptr;
    float eps = 0;
  };
  // What the last MoE layer left for the next one's predictions.
  struct Previous {
    int64_t layer = -2;  // -2: none this step
    int64_t n_tokens = 0;
    const float* out = nullptr;  // where its output went (the residual add reads it)
    std::vector<float> x;        // its input x_L [n_tokens, d_model]
    std::vector<float> h;        // the residual after it h_L [n_tokens, d_model]
    bool has_h = false;
    bool awaits_h = false;  // no add of `out` into the residual seen yet
  };

  // After an add of x into the residual h [n floats]: h_L when x is the last Moe's output.
  void SeeResidualAdd(const float* x, int64_t n, const float* h);
  void SeeNorm(const float* y, int64_t n_rows, const std::vector<float>& weight, float eps);
  // Predicts layer `layer` [n_tokens rows] from prev_ and counts the hits against `logits`.
  void Predict(const TensorView& router, const RouterOptions& opts, int64_t layer,
               const float* logits, int64_t n_tokens, const LastNorm& input_norm);
  PrefetchCounts::Layer& CountsFor(int64_t layer);

  std::unique_ptr<ComputeBackend> inner_;
  PrefetchCounts counts_;
  LastNorm last_norm_;
  Previous prev_;
  // Scratch, kept between calls.
  std::vector<float> logits_, predicted_, normed_;
  std::vector<int32_t> chosen_;
};

}  // namespace moetier
