// DecoderLM: the pre-norm decoder-only transformer with MoE feed-forward layers that Qwen3-MoE
// and Mixtral share (they differ in tensor names, config defaults and Qwen3's per-head q/k norm,
// which their files in arch/ bind). Architectures whose forward differs write their own.
//
// Per layer:  h += Attn(RmsNorm(h));  h += Moe(RmsNorm(h)) or Mlp(RmsNorm(h))
// Then:       logits = lm_head · RmsNorm(h)
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/rope.h"
#include "core/thread_pool.h"
#include "experts/expert_table.h"
#include "io/tensor_store.h"
#include "layers/attention.h"
#include "layers/moe_block.h"
#include "model/causal_lm.h"

namespace moetier {

struct DecoderLayerWeights {
  std::vector<float> attn_norm;  // [d_model]
  AttentionWeights attn;
  std::vector<float> mlp_norm;  // [d_model]
  bool is_moe = true;
  TensorView router;    // [n_experts, d_model] when is_moe
  ExpertWeights dense;  // the dense MLP when !is_moe
};

struct DecoderWeights {
  TensorView embed;  // [vocab, d_model]
  std::vector<DecoderLayerWeights> layers;
  std::vector<float> final_norm;  // [d_model]
  TensorView lm_head;             // [vocab, d_model]; the embedding when tied
};

class DecoderLM final : public CausalLM {
 public:
  // The model on the backend `compute` asks for (backend/make_backend.h), every weight handed to
  // it (ComputeBackend::Hold).
  static Expected<std::unique_ptr<CausalLM>> Create(
      ModelConfig config, std::unique_ptr<TensorStore> dense, DecoderWeights weights,
      std::unique_ptr<ExpertSource> experts, RouterOptions router, const ComputeOptions& compute);

  const ModelConfig& config() const override { return config_; }
  using CausalLM::Forward;
  Status Forward(const Batch& batch, KvPool& kv, std::vector<float>& logits) override;
  Status ForwardArgMax(const Batch& batch, KvPool& kv, std::vector<int32_t>& ids) override;
  Status ForwardTopK(const Batch& batch, KvPool& kv, TopKRows& out) override;
  bool CandidatesOnDevice() const override { return backend_->SelectsTopK(); }
  Status LogitsRow(int64_t r, std::vector<float>& out) override;
  uint64_t DecodeBytesPerToken() const override;
  uint64_t DecodeWeightsPerToken() const override;
  DType expert_dtype() const override;
  void SetRouterLogitsSink(std::vector<std::vector<float>>* sink) override {
    router_sink_ = sink;
    backend_->ExpectRouterLogits(sink != nullptr);
  }
  void SetPhaseTimes(PhaseTimes* times) override { backend_->SetPhaseTimes(times); }
  void CollectExpertStats() override;
  const ExpertStats* expert_stats() const override { return stats_.get(); }
  uint64_t WeightBytesStreamed() const override { return bytes_streamed_; }
  uint64_t WeightBytes() const override;
  uint64_t KvMemoryFree() const override { return backend_->KvMemoryFree(); }
  int64_t ReplayedSteps() const override { return backend_->ReplayedSteps(); }
  int32_t NonFiniteSequence() const override { return non_finite_seq_; }
  Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) const override {
    return backend_->AllocateKv(n_bytes);
  }
  ComputeDevice device() const override { return device_; }

 private:
  DecoderLM(ModelConfig config, std::unique_ptr<TensorStore> dense, DecoderWeights weights,
            std::unique_ptr<ExpertSource> experts, RouterOptions router);
  // Every dense matrix and vector of w_, for ComputeBackend::Hold.
  Status HoldWeights();
  // Every token's id, sequence, position and block, the logit rows, and the pool's shape.
  Status CheckBatch(const Batch& batch, const KvPool& kv) const;
  // The residual stream h [n_tokens, d_model] must be finite after each layer: a NaN or inf
  // (NaN weights, an overflow) is an error naming where it first appeared, instead of logits a
  // sampler cannot use. One vectorized scan, ~1/1000 of a layer's work. Scan slot 0 is the
  // embedding's, slot l + 1 layer l's; a GPU answers after the logits (CheckScans).
  Status ScanFinite(const float* h, const Batch& batch, int64_t slot);
  // The error of scan `slot`'s answer `bad` (its first non-finite index, or -1: none or deferred).
  Status ScanResult(int64_t bad, const Batch& batch, int64_t slot);
  // Forward's step, ending with one of: the logits, their arg-max, their top-k candidates.
  struct StepOut {
    std::vector<float>* logits = nullptr;
    std::vector<int32_t>* ids = nullptr;
    TopKRows* top_k = nullptr;
  };
  Status Step(const Batch& batch, KvPool& kv, StepOut out);
  // The non-finite scan slot of the logits (after every layer's).
  int64_t LogitsSlot() const { return config_.n_layers + 1; }
  Status CheckScans(const Batch& batch);
  Status NonFiniteAt(const Batch& batch, int64_t slot, int64_t index);
  // The error of a non-finite value in `where` at the batch's token `token`, whose sequence it
  // notes (NonFiniteSequence).
  Status NonFiniteError(const std::string& where, const Batch& batch, int64_t token);
  // The error of a non-finite logit at `index` (row * vocab + column of the step's logits).
  Status LogitsNonFinite(const Batch& batch, int64_t index);
  // Sums size(view) over what a decode step streams (DecodeBytesPerToken's list).
  uint64_t SumPerToken(FunctionRef<uint64_t(const TensorView&)> size) const;
  // The weight bytes a step of n_tokens with n_logits logit rows reads, but for the experts.
  uint64_t DenseBytesPerStep(int64_t n_tokens, int64_t n_logits) const;
  ModelConfig config_;
  std::unique_ptr<TensorStore> dense_;  // owns the memory maps the dense views point into
  DecoderWeights w_;
  std::unique_ptr<ExpertSource> experts_;
  RouterOptions router_;
  AttentionShape attn_shape_;
  Rope rope_;
  std::unique_ptr<ComputeBackend> backend_;
  ComputeDevice device_ = ComputeDevice::kCpu;
  uint64_t expert_bytes_ = 0;  // one expert's gate, up and down bytes (every layer alike)
  uint64_t bytes_streamed_ = 0;
  std::vector<std::vector<float>>* router_sink_ = nullptr;
  std::unique_ptr<ExpertStats> stats_;
  int32_t non_finite_seq_ = -1;  // NonFiniteSequence
};

}  // namespace moetier
