#include "model/decoder_lm.h"

#include <string>

#include <algorithm>
#include <cstdio>

#include "backend/make_backend.h"
#include "core/log.h"
#include "kernels/cpu/elementwise.h"
#include "layers/mlp.h"

namespace moetier {

Expected<std::unique_ptr<CausalLM>> DecoderLM::Create(
    ModelConfig config, std::unique_ptr<TensorStore> dense, DecoderWeights weights,
    std::unique_ptr<ExpertSource> experts, RouterOptions router, const ComputeOptions& compute) {
  std::unique_ptr<DecoderLM> m(new DecoderLM(std::move(config), std::move(dense),
                                             std::move(weights), std::move(experts), router));
  const ModelConfig& c = m->config_;
  ModelDims dims;
  dims.n_layers = c.n_layers;
  dims.d_model = c.hidden_size;
  dims.vocab = c.vocab_size;
  dims.n_heads = c.n_heads;
  dims.n_kv_heads = c.n_kv_heads;
  dims.head_dim = c.head_dim;
  dims.rope_theta = c.rope_theta;
  dims.n_experts = router.n_experts;
  dims.top_k = router.top_k;
  dims.expert_width = c.expert_intermediate_size;
  dims.dense_width = c.dense_intermediate_size;
  for (size_t l = 0; l < m->w_.layers.size(); ++l)
    if (m->w_.layers[l].is_moe) dims.moe_layers.push_back(static_cast<int64_t>(l));
  MT_ASSIGN_OR_RETURN(m->backend_, MakeBackend(compute, *m->experts_, dims));
  m->device_ = compute.device;
  MT_RETURN_IF_ERROR(m->HoldWeights());
  return std::unique_ptr<CausalLM>(std::move(m));
}

void DecoderLM::CollectExpertStats() {
  if (stats_ != nullptr) return;
  std::vector<int64_t> moe_layers;
  for (size_t l = 0; l < w_.layers.size(); ++l)
    if (w_.layers[l].is_moe) moe_layers.push_back(static_cast<int64_t>(l));
  stats_ = std::make_unique<ExpertStats>(std::move(moe_layers));
  backend_->SetExpertStats(stats_.get());
}

Status DecoderLM::HoldWeights() {
  std::vector<const TensorView*> matrices = {&w_.embed, &w_.lm_head};
  std::vector<const std::vector<float>*> vectors = {&w_.final_norm};
  for (const DecoderLayerWeights& lw : w_.layers) {
    for (const TensorView* m : {&lw.attn.q, &lw.attn.k, &lw.attn.v, &lw.attn.o})
      matrices.push_back(m);
    for (const std::vector<float>* v :
         {&lw.attn_norm, &lw.mlp_norm, &lw.attn.q_bias, &lw.attn.k_bias, &lw.attn.v_bias,
          &lw.attn.q_norm, &lw.attn.k_norm})
      if (!v->empty()) vectors.push_back(v);
    if (lw.is_moe) {
      matrices.push_back(&lw.router);
    } else {
      for (const TensorView* m : {&lw.dense.gate, &lw.dense.up, &lw.dense.down})
        matrices.push_back(m);
    }
  }
  MT_RETURN_IF_ERROR(backend_->Hold(matrices, vectors));
  const uint64_t freed = experts_->ReleaseHost(backend_->LayersWithOwnExperts());
  if (freed > 0) {
    char line[96];
    std::snprintf(line, sizeof line, "experts: %.2f GB of host copies freed (held in VRAM)",
                  static_cast<double>(freed) / 1e9);
    LogInfo(line);
  }
  return OkStatus();
}

DecoderLM::DecoderLM(ModelConfig config, std::unique_ptr<TensorStore> dense, DecoderWeights weights,
                     std::unique_ptr<ExpertSource> experts, RouterOptions router)
    : config_(std::move(config)),
      dense_(std::move(dense)),
      w_(std::move(weights)),
      experts_(std::move(experts)),
      router_(router),
      rope_(config_.head_dim, config_.rope_theta) {
  attn_shape_.d_model = config_.hidden_size;
  attn_shape_.n_heads = config_.n_heads;
  attn_shape_.n_kv_heads = config_.n_kv_heads;
  attn_shape_.head_dim = config_.head_dim;
  attn_shape_.sliding_window = config_.sliding_window;
  attn_shape_.norm_eps = static_cast<float>(config_.rms_norm_eps);
  for (size_t l = 0; l < w_.layers.size() && expert_bytes_ == 0; ++l) {
    if (!w_.layers[l].is_moe) continue;
    const ExpertWeights& e = experts_->Expert(static_cast<int64_t>(l), 0);
    expert_bytes_ = e.gate.n_bytes + e.up.n_bytes + e.down.n_bytes;
  }
}

Status DecoderLM::CheckBatch(const Batch& b, const KvPool& kv) const {
  const int64_t T = b.n_tokens(), V = config_.vocab_size;
  if (T == 0) return Status::Error("no tokens to run");
  if (b.positions.size() != b.tokens.size() || b.seq_of.size() != b.tokens.size())
    return Status::Error("a batch needs a position and a sequence for every token");
  const int64_t B = kv.block_size();
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = b.tokens[static_cast<size_t>(t)];
    if (id < 0 || id >= V)
      return Status::Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                           std::to_string(V) + ")");
    const int32_t seq = b.seq_of[static_cast<size_t>(t)];
    const int32_t pos = b.positions[static_cast<size_t>(t)];
    if (seq < 0 || static_cast<size_t>(seq) >= b.block_tables.size() || pos < 0 ||
        pos / B >= static_cast<int64_t>(b.block_tables[static_cast<size_t>(seq)].size()))
      return Status::Error("token " + std::to_string(t) + " of the batch (sequence " +
                           std::to_string(seq) + ", position " + std::to_string(pos) +
                           ") has no KV block");
  }
  for (const auto& table : b.block_tables)
    for (int32_t block : table)
      if (block < 0 || block >= kv.n_blocks())
        return Status::Error("a block table names block " + std::to_string(block) +
                             " of a pool of " + std::to_string(kv.n_blocks()));
  for (size_t r = 0; r < b.logit_rows.size(); ++r)
    if (b.logit_rows[r] < 0 || b.logit_rows[r] >= T ||
        (r > 0 && b.logit_rows[r] <= b.logit_rows[r - 1]))
      return Status::Error("logit rows must be ascending token indices of the batch");
  if (!b.scored.empty() && b.scored.size() != b.logit_rows.size())
    return Status::Error("a batch's scored tokens must be one a logit row");
  if (kv.shape().n_layers != config_.n_layers ||
      kv.shape().row() != config_.n_kv_heads * config_.head_dim)
    return Status::Error("the KV cache was made for another model's shape");
  return OkStatus();
}

Status DecoderLM::Forward(const Batch& batch, KvPool& kv, std::vector<float>& logits) {
  return Step(batch, kv, {.logits = &logits});
}

Status DecoderLM::ForwardArgMax(const Batch& batch, KvPool& kv, std::vector<int32_t>& ids) {
  return Step(batch, kv, {.ids = &ids});
}

Status DecoderLM::ForwardTopK(const Batch& batch, KvPool& kv, TopKRows& out) {
  return Step(batch, kv, {.top_k = &out});
}

Status DecoderLM::LogitsRow(int64_t r, std::vector<float>& out) {
  out.resize(static_cast<size_t>(config_.vocab_size));
  return backend_->CopyLogitsRow(r, out.data());
}

Status DecoderLM::Step(const Batch& batch, KvPool& kv, StepOut out) {
  std::vector<float>* logits = out.logits;
  std::vector<int32_t>* ids = out.ids;
  non_finite_seq_ = -1;
  MT_RETURN_IF_ERROR(CheckBatch(batch, kv));
  ComputeBackend& be = *backend_;
  const int64_t T = batch.n_tokens();
  const int64_t H = config_.hidden_size;
  const int64_t V = config_.vocab_size;
  const int64_t n_out = static_cast<int64_t>(batch.logit_rows.size());
  ScopedPhase forward_phase(be.phase_times(), Phase::kForward);
  bytes_streamed_ += DenseBytesPerStep(T, n_out);

  be.BeginStep(batch, kv,
               ids != nullptr         ? StepOutput::kArgMax
               : out.top_k != nullptr ? StepOutput::kTopK
                                      : StepOutput::kLogits);
  float* h = be.Activations(Act::kResidual, T, H);
  float* xn = be.Activations(Act::kNormed, std::max(T, n_out), H);
  float* delta = be.Activations(Act::kDelta, T, H);
  be.Embed(w_.embed, batch.tokens, h);
  MT_RETURN_IF_ERROR(ScanFinite(h, batch, 0));

  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (router_sink_ != nullptr) router_sink_->assign(static_cast<size_t>(config_.n_layers), {});
  // Each residual add is fused with the norm that reads its sum (the next sublayer's input).
  if (config_.n_layers > 0) be.RmsNorm(h, T, {}, w_.layers[0].attn_norm, eps, H, xn);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const DecoderLayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    SelfAttention(be, lw.attn, attn_shape_, rope_, l, batch, kv, xn, delta);
    be.AddRmsNorm(delta, T, h, lw.mlp_norm, eps, H, xn);
    if (lw.is_moe) {
      float* sink = nullptr;
      if (router_sink_ != nullptr) {
        auto& dst = (*router_sink_)[static_cast<size_t>(l)];
        dst.resize(static_cast<size_t>(T * router_.n_experts));
        sink = dst.data();
      }
      MoeBlock(be, lw.router, router_, l, xn, T, delta, sink);
    } else {
      SwiGlu(be, lw.dense, xn, T, delta);
    }
    if (l + 1 < config_.n_layers) {
      const std::vector<float>& next_norm = w_.layers[static_cast<size_t>(l + 1)].attn_norm;
      MT_RETURN_IF_ERROR(
          ScanResult(be.AddRmsNormScan(delta, T, h, next_norm, eps, H, xn, l + 1), batch, l + 1));
    } else {
      be.Add(delta, T * H, h);
      MT_RETURN_IF_ERROR(ScanFinite(h, batch, l + 1));
    }
  }

  ScopedPhase lm_head_phase(be.phase_times(), Phase::kLmHead);
  if (logits != nullptr) logits->resize(static_cast<size_t>(n_out * V));
  if (ids != nullptr) ids->resize(static_cast<size_t>(n_out));
  if (out.top_k != nullptr) {
    out.top_k->cands.resize(static_cast<size_t>(n_out * kMaxLogitCandidates));
    out.top_k->counts.resize(static_cast<size_t>(n_out));
    out.top_k->sums.resize(batch.scored.empty() ? 0 : static_cast<size_t>(n_out));
  }
  if (n_out > 0) {
    be.RmsNorm(h, T, batch.logit_rows, w_.final_norm, eps, H, xn);
    if (ids != nullptr)
      be.ArgMaxLogits(xn, n_out, w_.lm_head, ids->data(), LogitsSlot());
    else if (out.top_k != nullptr)
      be.TopKLogits(xn, n_out, w_.lm_head, out.top_k->cands.data(), out.top_k->counts.data(),
                    batch.scored.empty() ? nullptr : out.top_k->sums.data(), LogitsSlot());
    else
      be.Logits(xn, n_out, w_.lm_head, logits->data());
  }
  MT_RETURN_IF_ERROR(be.EndStep());
  bytes_streamed_ += static_cast<uint64_t>(be.TakeActiveExperts()) * expert_bytes_;
  MT_RETURN_IF_ERROR(CheckScans(batch));  // the scan of the logits among them (not Logits')
  if (logits == nullptr) return OkStatus();
  const int64_t bad = kernels::FirstNonFinite(logits->data(), n_out * V);
  return bad < 0 ? OkStatus() : LogitsNonFinite(batch, bad);
}

Status DecoderLM::LogitsNonFinite(const Batch& batch, int64_t index) {
  const auto row = static_cast<size_t>(index / config_.vocab_size);
  return NonFiniteError("the lm_head", batch, batch.logit_rows[row]);
}

Status DecoderLM::NonFiniteError(const std::string& where, const Batch& batch, int64_t token) {
  const auto t = static_cast<size_t>(token);
  non_finite_seq_ = batch.seq_of[t];
  return Status::Error(config_.source + ": " + where +
                       " produced a non-finite value (NaN or inf) at position " +
                       std::to_string(batch.positions[t]) +
                       "; the model's weights hold NaN/inf or its config is wrong");
}

Status DecoderLM::NonFiniteAt(const Batch& batch, int64_t slot, int64_t index) {
  return NonFiniteError(slot == 0 ? "the embedding" : "layer " + std::to_string(slot - 1), batch,
                        index / config_.hidden_size);
}

Status DecoderLM::ScanFinite(const float* h, const Batch& batch, int64_t slot) {
  return ScanResult(backend_->ScanNonFinite(h, batch.n_tokens() * config_.hidden_size, slot), batch,
                    slot);
}

Status DecoderLM::ScanResult(int64_t bad, const Batch& batch, int64_t slot) {
  return bad < 0 ? OkStatus() : NonFiniteAt(batch, slot, bad);
}

Status DecoderLM::CheckScans(const Batch& batch) {
  const std::span<const int64_t> scans = backend_->NonFiniteScans();
  for (size_t slot = 0; slot < scans.size(); ++slot) {
    if (scans[slot] < 0) continue;
    if (static_cast<int64_t>(slot) == LogitsSlot()) return LogitsNonFinite(batch, scans[slot]);
    return NonFiniteAt(batch, static_cast<int64_t>(slot), scans[slot]);
  }
  return OkStatus();
}

}  // namespace moetier

namespace moetier {

uint64_t DecoderLM::SumPerToken(FunctionRef<uint64_t(const TensorView&)> size) const {
  uint64_t n = size(w_.embed) / static_cast<uint64_t>(config_.vocab_size);  // one row
  n += size(w_.lm_head);
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const DecoderLayerWeights& lw = w_.layers[l];
    n += size(lw.attn.q) + size(lw.attn.k) + size(lw.attn.v) + size(lw.attn.o);
    if (lw.is_moe) {
      const ExpertWeights& e = experts_->Expert(static_cast<int64_t>(l), 0);
      n += size(lw.router) +
           static_cast<uint64_t>(router_.top_k) * (size(e.gate) + size(e.up) + size(e.down));
    } else {
      n += size(lw.dense.gate) + size(lw.dense.up) + size(lw.dense.down);
    }
  }
  return n;
}

uint64_t DecoderLM::DenseBytesPerStep(int64_t n_tokens, int64_t n_logits) const {
  uint64_t n = static_cast<uint64_t>(n_tokens) *
               (w_.embed.n_bytes / static_cast<uint64_t>(config_.vocab_size));
  if (n_logits > 0) n += w_.lm_head.n_bytes;
  for (const DecoderLayerWeights& lw : w_.layers) {
    n += lw.attn.q.n_bytes + lw.attn.k.n_bytes + lw.attn.v.n_bytes + lw.attn.o.n_bytes;
    n += lw.is_moe ? lw.router.n_bytes
                   : lw.dense.gate.n_bytes + lw.dense.up.n_bytes + lw.dense.down.n_bytes;
  }
  return n;
}

uint64_t DecoderLM::WeightBytes() const {
  auto vec = [](const std::vector<float>& v) {
    return static_cast<uint64_t>(v.size() * sizeof(float));
  };
  uint64_t n = w_.embed.n_bytes + vec(w_.final_norm);
  if (w_.lm_head.data != w_.embed.data) n += w_.lm_head.n_bytes;
  for (const DecoderLayerWeights& lw : w_.layers) {
    n += lw.attn.q.n_bytes + lw.attn.k.n_bytes + lw.attn.v.n_bytes + lw.attn.o.n_bytes;
    n += vec(lw.attn_norm) + vec(lw.mlp_norm) + vec(lw.attn.q_norm) + vec(lw.attn.k_norm);
    n += lw.is_moe ? lw.router.n_bytes + static_cast<uint64_t>(router_.n_experts) * expert_bytes_
                   : lw.dense.gate.n_bytes + lw.dense.up.n_bytes + lw.dense.down.n_bytes;
  }
  return n;
}

uint64_t DecoderLM::DecodeBytesPerToken() const {
  return SumPerToken([](const TensorView& v) { return static_cast<uint64_t>(v.n_bytes); });
}

uint64_t DecoderLM::DecodeWeightsPerToken() const {
  return SumPerToken([](const TensorView& v) { return static_cast<uint64_t>(v.NumElements()); });
}

DType DecoderLM::expert_dtype() const {
  for (size_t l = 0; l < w_.layers.size(); ++l)
    if (w_.layers[l].is_moe) return experts_->Expert(static_cast<int64_t>(l), 0).gate.dtype;
  return w_.embed.dtype;
}

}  // namespace moetier
