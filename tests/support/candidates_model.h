// A CPU model that says it selects candidates on its device (CausalLM::CandidatesOnDevice), so
// that the engine's paths for a GPU's steps — ForwardTopK with every logit row, log-probabilities
// from candidates and log-sum-exps (Batch::scored) — run in tests without a GPU. The CPU backend
// computes the same candidates and sums; it draws nothing, so a step naming device draws is
// refused: run the engine with EngineOptions::device_draws = false.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/causal_lm.h"

namespace moetier::testing {

class CandidatesModel : public CausalLM {
 public:
  explicit CandidatesModel(CausalLM& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  Status Forward(const Batch& b, KvPool& kv, std::vector<float>& logits) override {
    return inner_.Forward(b, kv, logits);
  }
  Status ForwardArgMax(const Batch& b, KvPool& kv, std::vector<int32_t>& ids) override {
    return inner_.ForwardArgMax(b, kv, ids);
  }
  Status ForwardTopK(const Batch& b, KvPool& kv, TopKRows& out) override {
    for (const RowDraw& d : b.draws)
      if (d.u >= 0.0) return Status::Error("CandidatesModel draws nothing: device_draws = false");
    scored_steps_ += b.scored.empty() ? 0 : 1;
    return inner_.ForwardTopK(b, kv, out);
  }
  // ForwardTopK steps whose batch named Batch::scored.
  int64_t scored_steps() const { return scored_steps_; }
  bool CandidatesOnDevice() const override { return true; }
  Status LogitsRow(int64_t r, std::vector<float>& out) override {
    ++rows_read_;
    return inner_.LogitsRow(r, out);
  }
  int64_t rows_read() const { return rows_read_; }
  int32_t NonFiniteSequence() const override { return inner_.NonFiniteSequence(); }
  uint64_t DecodeBytesPerToken() const override { return inner_.DecodeBytesPerToken(); }
  uint64_t DecodeWeightsPerToken() const override { return inner_.DecodeWeightsPerToken(); }
  uint64_t WeightBytesStreamed() const override { return inner_.WeightBytesStreamed(); }
  uint64_t WeightBytes() const override { return inner_.WeightBytes(); }
  DType expert_dtype() const override { return inner_.expert_dtype(); }
  void SetRouterLogitsSink(std::vector<std::vector<float>>* sink) override {
    inner_.SetRouterLogitsSink(sink);
  }
  void SetPhaseTimes(PhaseTimes* times) override { inner_.SetPhaseTimes(times); }
  void CollectExpertStats() override { inner_.CollectExpertStats(); }
  const ExpertStats* expert_stats() const override { return inner_.expert_stats(); }
  int64_t ReplayedSteps() const override { return inner_.ReplayedSteps(); }
  ComputeDevice device() const override { return inner_.device(); }
  uint64_t KvMemoryFree() const override { return inner_.KvMemoryFree(); }
  Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) const override {
    return inner_.AllocateKv(n_bytes);
  }

 private:
  CausalLM& inner_;
  int64_t scored_steps_ = 0;
  int64_t rows_read_ = 0;
};

}  // namespace moetier::testing
