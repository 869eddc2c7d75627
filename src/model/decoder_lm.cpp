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

Status DecoderLM::Forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                          std::vector<float>& logits) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t H = config_.hidden_size;
  const int64_t V = config_.vocab_size;
  if (T == 0) return Status::Error("no tokens to run");
  for (int32_t id : tokens)
    if (id < 0 || id >= V)
      return Status::Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                           std::to_string(V) + ")");
  MT_RETURN_IF_ERROR(cache.Reserve(T));
  ScopedPhase forward_phase(ws_.times(), Phase::kForward);

  const size_t n_act = static_cast<size_t>(T * H);
  h_.resize(n_act);
  xn_.resize(n_act);
  delta_.resize(n_act);
  for (int64_t t = 0; t < T; ++t)
    kernels::RowToF32(w_.embed, static_cast<int64_t>(tokens[static_cast<size_t>(t)]) * H, H,
                      h_.data() + t * H);

  MT_RETURN_IF_ERROR(CheckFinite(h_.data(), T, kEmbeddingLayer, cache.n_past()));

  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (router_sink_ != nullptr) router_sink_->assign(static_cast<size_t>(config_.n_layers), {});
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const DecoderLayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    for (int64_t t = 0; t < T; ++t)
      kernels::RmsNormRow(h_.data() + t * H, lw.attn_norm.data(), eps, H, xn_.data() + t * H);
    SelfAttention(ws_, lw.attn, attn_shape_, rope_, l, cache, xn_.data(), T, delta_.data());
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
    MT_RETURN_IF_ERROR(CheckFinite(h_.data(), T, l, cache.n_past()));
  }
  cache.Advance(T);

  ScopedPhase lm_head_phase(ws_.times(), Phase::kLmHead);
  const int64_t first = which == LogitsFor::kLastToken ? T - 1 : 0;
  const int64_t n_out = T - first;
  for (int64_t t = first; t < T; ++t)
    kernels::RmsNormRow(h_.data() + t * H, w_.final_norm.data(), eps, H,
                        xn_.data() + (t - first) * H);
  logits.resize(static_cast<size_t>(n_out * V));
  kernels::MatMul(pool_, xn_.data(), n_out, w_.lm_head, logits.data());
  const int64_t bad = kernels::FirstNonFinite(logits.data(), n_out * V);
  if (bad >= 0) return NonFiniteError("the lm_head", cache.n_past() - T + first + bad / V);
  return OkStatus();
}

Status DecoderLM::NonFiniteError(const std::string& where, int64_t position) const {
  return Status::Error(
      config_.source + ": " + where + " produced a non-finite value (NaN or inf) at position " +
      std::to_string(position) + "; the model's weights hold NaN/inf or its config is wrong");
}

Status DecoderLM::CheckFinite(const float* h, int64_t n_tokens, int64_t layer, int64_t pos0) const {
  const int64_t H = config_.hidden_size;
  const int64_t bad = kernels::FirstNonFinite(h, n_tokens * H);
  if (bad < 0) return OkStatus();
  return NonFiniteError(
      layer == kEmbeddingLayer ? "the embedding" : "layer " + std::to_string(layer),
      pos0 + bad / H);
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
