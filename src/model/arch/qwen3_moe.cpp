// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3-30B-A3B, Qwen3-235B-A22B.
//
// Settings: `num_experts`/`num_local_experts` routed experts of width `moe_intermediate_size`,
// top-`num_experts_per_tok`, renormalised when `norm_topk_prob` (default false). Layers listed
// in `mlp_only_layers`, or off the `decoder_sparse_step` grid, are dense MLPs of width
// `intermediate_size`. Grouped-query attention with a per-head RMSNorm of q and k before RoPE;
// no attention bias unless `attention_bias`; `sliding_window` limits attention only when
// `use_sliding_window`. Embeddings tied when `tie_word_embeddings`. `rope_theta` defaults to
// 10000. Expert tensors: one per expert and matrix (gate_proj, up_proj, down_proj).
//
// Forward: the standard MoE decoder of model/decoder_lm.h.
#include <string>

#include "model/arch/arch.h"
#include "model/decoder_lm.h"
#include "model/weight_binder.h"

namespace moetier::arch {

namespace {

constexpr std::string_view kEmbeddingName = "model.embed_tokens.weight";

// Which layers are MoE: those on the `decoder_sparse_step` grid ((layer + 1) % step == 0) and
// not listed in `mlp_only_layers`; the others are dense MLPs.
Status ReadQwen3MoeLayers(const ConfigReader& r, ModelConfig& c) {
  int64_t step = 1;
  MT_RETURN_IF_ERROR(r.Int("decoder_sparse_step", step, FieldPresence::kOptional));
  if (step <= 0) return r.Error("field 'decoder_sparse_step' must be positive");
  c.layer_is_moe.assign(static_cast<size_t>(c.n_layers), true);
  for (int64_t l = 0; l < c.n_layers; ++l)
    c.layer_is_moe[static_cast<size_t>(l)] = (l + 1) % step == 0;
  if (!r.Has("mlp_only_layers")) return OkStatus();
  const nlohmann::json& m = r.object()["mlp_only_layers"];
  if (!m.is_array()) return r.Error("field 'mlp_only_layers' must be a list of layer ids");
  for (const auto& e : m) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.n_layers)
      return r.Error("field 'mlp_only_layers' holds " + e.dump() + ", not a layer id in [0, " +
                     std::to_string(c.n_layers) + ")");
    c.layer_is_moe[e.get<size_t>()] = false;
  }
  return OkStatus();
}

// ArchSpec::parse_config, with Qwen3MoeConfig's defaults.
Status ParseQwen3MoeConfig(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const ConfigReader r(j, source);
  MT_RETURN_IF_ERROR(
      r.Int("moe_intermediate_size", c.expert_intermediate_size, FieldPresence::kRequired));
  // Both spellings occur: `num_experts` in the original checkpoints, `num_local_experts` in
  // those transformers 5 writes.
  MT_RETURN_IF_ERROR(r.Int(r.Has("num_experts") ? "num_experts" : "num_local_experts", c.n_experts,
                           FieldPresence::kRequired));
  c.norm_topk_prob = false;
  MT_RETURN_IF_ERROR(r.Bool("norm_topk_prob", c.norm_topk_prob));
  // `sliding_window` is set in most configs but applies only with use_sliding_window.
  bool use_sliding_window = false;
  MT_RETURN_IF_ERROR(r.Bool("use_sliding_window", use_sliding_window));
  if (use_sliding_window)
    MT_RETURN_IF_ERROR(r.Int("sliding_window", c.sliding_window, FieldPresence::kOptional));
  return ReadQwen3MoeLayers(r, c);
}

std::string Qwen3MoeRouterName(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.gate.weight";
}

// ArchSpec::bind_dense: every dense tensor the forward reads.
DecoderWeights BindQwen3MoeDense(const ModelConfig& c, WeightBinder& b) {
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
    if (c.attention_bias) {
      lw.attn.q_bias = b.Vector(p + "self_attn.q_proj.bias", q_width);
      lw.attn.k_bias = b.Vector(p + "self_attn.k_proj.bias", kv_width);
      lw.attn.v_bias = b.Vector(p + "self_attn.v_proj.bias", kv_width);
    }
    lw.attn.q_norm = b.Vector(p + "self_attn.q_norm.weight", hd);
    lw.attn.k_norm = b.Vector(p + "self_attn.k_norm.weight", hd);
    lw.mlp_norm = b.Vector(p + "post_attention_layernorm.weight", H);
    lw.is_moe = c.layer_is_moe[static_cast<size_t>(l)];
    if (lw.is_moe) {
      lw.router = b.Matrix(Qwen3MoeRouterName(l), {c.n_experts, H});
    } else {
      const int64_t D = c.dense_intermediate_size;
      lw.dense.gate = b.Matrix(p + "mlp.gate_proj.weight", {D, H});
      lw.dense.up = b.Matrix(p + "mlp.up_proj.weight", {D, H});
      lw.dense.down = b.Matrix(p + "mlp.down_proj.weight", {H, D});
    }
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = b.Vector("model.norm.weight", H);
  w.lm_head = c.tie_word_embeddings ? w.embed : b.Matrix("lm_head.weight", {c.vocab_size, H});
  return w;
}

Expected<std::unique_ptr<CausalLM>> CreateQwen3Moe(ModelConfig c,
                                                   std::unique_ptr<TensorStore> dense,
                                                   std::unique_ptr<ExpertSource> experts,
                                                   const ComputeOptions& compute) {
  WeightBinder b(*dense, c);
  DecoderWeights w = BindQwen3MoeDense(c, b);
  MT_RETURN_IF_ERROR(b.status());

  const RouterOptions router{c.n_experts, c.n_experts_per_token, c.norm_topk_prob};
  return DecoderLM::Create(std::move(c), std::move(dense), std::move(w), std::move(experts), router,
                           compute);
}

ExpertTensorBinding Qwen3MoeExpertTensor(int64_t layer, int64_t expert, ExpertMatrix which) {
  const char* matrix = which == ExpertMatrix::kGate ? "gate_proj.weight"
                       : which == ExpertMatrix::kUp ? "up_proj.weight"
                                                    : "down_proj.weight";
  return {"model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." +
          matrix};
}

}  // namespace

const ArchSpec& Qwen3MoeSpec() {
  static const ArchSpec spec{"Qwen3MoeForCausalLM", &ParseQwen3MoeConfig, &Qwen3MoeExpertTensor,
                             &Qwen3MoeRouterName,   kEmbeddingName,       &BindQwen3MoeDense,
                             &CreateQwen3Moe};
  return spec;
}

}  // namespace moetier::arch
