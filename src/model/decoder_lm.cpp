#include "model/decoder_lm.h"

#include <string>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "layers/mlp.h"

namespace moetier {

DecoderLM::DecoderLM(ModelConfig config, std::unique_ptr<TensorStore> dense, DecoderWeights weights,
                     std::unique_ptr<ExpertSource> experts, RouterOptions router, int n_threads)
    : config_(std::move(config)),
      dense_(std::move(dense)),
      w_(std::move(weights)),
      experts_(std::move(experts)),
      router_(router),
      rope_(config_.head_dim, config_.rope_theta),
      pool_(n_threads),
      ws_(pool_) {
  attn_shape_.d_model = config_.hidden_size;
  attn_shape_.n_heads = config_.n_heads;
  attn_shape_.n_kv_heads = config_.n_kv_heads;
  attn_shape_.head_dim = config_.head_dim;
  attn_shape_.sliding_window = config_.sliding_window;
  attn_shape_.norm_eps = static_cast<float>(config_.rms_norm_eps);
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
  if (kv.shape().n_layers != config_.n_layers ||
      kv.shape().row() != config_.n_kv_heads * config_.head_dim)
    return Status::Error("the KV cache was made for another model's shape");
  return OkStatus();
}

Status DecoderLM::Forward(const Batch& batch, KvPool& kv, std::vector<float>& logits) {
  MT_RETURN_IF_ERROR(CheckBatch(batch, kv));
  const int64_t T = batch.n_tokens();
  const int64_t H = config_.hidden_size;
  const int64_t V = config_.vocab_size;
  ScopedPhase forward_phase(ws_.times(), Phase::kForward);

  const size_t n_act = static_cast<size_t>(T * H);
  h_.resize(n_act);
  xn_.resize(n_act);
  delta_.resize(n_act);
  for (int64_t t = 0; t < T; ++t)
    kernels::RowToF32(w_.embed, static_cast<int64_t>(batch.tokens[static_cast<size_t>(t)]) * H, H,
                      h_.data() + t * H);
  MT_RETURN_IF_ERROR(CheckFinite(h_.data(), batch, kEmbeddingLayer));

  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (router_sink_ != nullptr) router_sink_->assign(static_cast<size_t>(config_.n_layers), {});
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const DecoderLayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    for (int64_t t = 0; t < T; ++t)
      kernels::RmsNormRow(h_.data() + t * H, lw.attn_norm.data(), eps, H, xn_.data() + t * H);
    SelfAttention(ws_, lw.attn, attn_shape_, rope_, l, batch, kv, xn_.data(), delta_.data());
    kernels::Axpy(1.0f, delta_.data(), T * H, h_.data());

    for (int64_t t = 0; t < T; ++t)
      kernels::RmsNormRow(h_.data() + t * H, lw.mlp_norm.data(), eps, H, xn_.data() + t * H);
    if (lw.is_moe) {
      float* sink = nullptr;
      if (router_sink_ != nullptr) {
        auto& dst = (*router_sink_)[static_cast<size_t>(l)];
        dst.resize(static_cast<size_t>(T * router_.n_experts));
        sink = dst.data();
      }
      MoeBlock(ws_, lw.router, router_, *experts_, l, xn_.data(), T, H, delta_.data(), sink);
    } else {
      SwiGlu(ws_, lw.dense, xn_.data(), T, delta_.data());
    }
    kernels::Axpy(1.0f, delta_.data(), T * H, h_.data());
    MT_RETURN_IF_ERROR(CheckFinite(h_.data(), batch, l));
  }

  ScopedPhase lm_head_phase(ws_.times(), Phase::kLmHead);
  const int64_t n_out = static_cast<int64_t>(batch.logit_rows.size());
  for (int64_t r = 0; r < n_out; ++r)
    kernels::RmsNormRow(h_.data() + batch.logit_rows[static_cast<size_t>(r)] * H,
                        w_.final_norm.data(), eps, H, xn_.data() + r * H);
  logits.resize(static_cast<size_t>(n_out * V));
  if (n_out == 0) return OkStatus();
  kernels::MatMul(pool_, xn_.data(), n_out, w_.lm_head, logits.data());
  const int64_t bad = kernels::FirstNonFinite(logits.data(), n_out * V);
  if (bad >= 0)
    return NonFiniteError(
        "the lm_head",
        batch.positions[static_cast<size_t>(batch.logit_rows[static_cast<size_t>(bad / V)])]);
  return OkStatus();
}

Status DecoderLM::NonFiniteError(const std::string& where, int64_t position) const {
  return Status::Error(
      config_.source + ": " + where + " produced a non-finite value (NaN or inf) at position " +
      std::to_string(position) + "; the model's weights hold NaN/inf or its config is wrong");
}

Status DecoderLM::CheckFinite(const float* h, const Batch& batch, int64_t layer) const {
  const int64_t H = config_.hidden_size;
  const int64_t bad = kernels::FirstNonFinite(h, batch.n_tokens() * H);
  if (bad < 0) return OkStatus();
  return NonFiniteError(
      layer == kEmbeddingLayer ? "the embedding" : "layer " + std::to_string(layer),
      batch.positions[static_cast<size_t>(bad / H)]);
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
