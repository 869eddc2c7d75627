// Mixtral (MixtralForCausalLM): Mixtral-8x7B, Mixtral-8x22B.
//
// Settings: `num_local_experts` experts of width `intermediate_size`, top-`num_experts_per_tok`,
// always renormalised (`norm_topk_prob` is not read). Every layer is MoE. Grouped-query
// attention without q/k norm or bias; `head_dim` defaults to hidden_size / num_attention_heads;
// `sliding_window` (when not null) limits attention. `rope_theta` defaults to 1e6. Expert
// tensors: one per expert and matrix, w1 (gate), w3 (up) and w2 (down).
//
// Forward: the standard MoE decoder of model/decoder_lm.h.
#include <string>

#include "model/arch/arch.h"
#include "model/decoder_lm.h"
#include "model/weight_binder.h"

namespace moetier::arch {

namespace {

constexpr std::string_view kEmbeddingName = "model.embed_tokens.weight";

// MixtralConfig's default, where config.json gives no rope_theta.
constexpr double kMixtralRopeTheta = 1e6;

// ArchSpec::parse_config, with MixtralConfig's defaults.
Status ParseMixtralConfig(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const ConfigReader r(j, source);
  // Every layer is MoE, so `intermediate_size` is the experts' width.
  MT_RETURN_IF_ERROR(
      r.Int("intermediate_size", c.expert_intermediate_size, FieldPresence::kRequired));
  MT_RETURN_IF_ERROR(r.Int("num_local_experts", c.n_experts, FieldPresence::kRequired));
  c.layer_is_moe.assign(static_cast<size_t>(c.n_layers), true);
  // Mixtral always renormalises the top-k weights; it has no switch for it.
  c.norm_topk_prob = true;
  if (!DeclaresRopeTheta(j)) c.rope_theta = kMixtralRopeTheta;
  // No use_sliding_window here: a window, when not null, always applies.
  return r.Int("sliding_window", c.sliding_window, FieldPresence::kOptional);
}

std::string MixtralRouterName(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".block_sparse_moe.gate.weight";
}

// ArchSpec::bind_dense: every dense tensor the forward reads.
DecoderWeights BindMixtralDense(const ModelConfig& c, WeightBinder& b) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_width = c.n_heads * hd, kv_width = c.n_kv_heads * hd;

  DecoderWeights w;
  w.embed = b.Matrix(std::string(kEmbeddingName), {c.vocab_size, H});
  for (int64_t l = 0; l < c.n_layers && b.status().ok(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayerWeights lw;
    lw.attn_norm = b.Vector(p + "input_layernorm.weight", H);
    lw.attn.q = b.Matrix(p + "self_attn.q_proj.weight", {q_width, H});
    lw.attn.k = b.Matrix(p + "self_attn.k_proj.weight", {kv_width, H});
    lw.attn.v = b.Matrix(p + "self_attn.v_proj.weight", {kv_width, H});
    lw.attn.o = b.Matrix(p + "self_attn.o_proj.weight", {H, q_width});
    lw.mlp_norm = b.Vector(p + "post_attention_layernorm.weight", H);
    lw.is_moe = true;
    lw.router = b.Matrix(MixtralRouterName(l), {c.n_experts, H});
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = b.Vector("model.norm.weight", H);
  w.lm_head = c.tie_word_embeddings ? w.embed : b.Matrix("lm_head.weight", {c.vocab_size, H});
  return w;
}

Expected<std::unique_ptr<CausalLM>> CreateMixtral(ModelConfig c, std::unique_ptr<TensorStore> dense,
                                                  std::unique_ptr<ExpertSource> experts,
                                                  const ComputeOptions& compute) {
  WeightBinder b(*dense, c);
  DecoderWeights w = BindMixtralDense(c, b);
  MT_RETURN_IF_ERROR(b.status());

  const RouterOptions router{c.n_experts, c.n_experts_per_token, true};
  return DecoderLM::Create(std::move(c), std::move(dense), std::move(w), std::move(experts), router,
                           compute);
}

ExpertTensorBinding MixtralExpertTensor(int64_t layer, int64_t expert, ExpertMatrix which) {
  const char* matrix = which == ExpertMatrix::kGate ? "w1.weight"
                       : which == ExpertMatrix::kUp ? "w3.weight"
                                                    : "w2.weight";
  return {"model.layers." + std::to_string(layer) + ".block_sparse_moe.experts." +
          std::to_string(expert) + "." + matrix};
}

}  // namespace

const ArchSpec& MixtralSpec() {
  static const ArchSpec spec{"MixtralForCausalLM", &ParseMixtralConfig, &MixtralExpertTensor,
                             &MixtralRouterName,   kEmbeddingName,      &BindMixtralDense,
                             &CreateMixtral};
  return spec;
}

}  // namespace moetier::arch
