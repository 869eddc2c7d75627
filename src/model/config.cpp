#include "model/config.h"

#include <cmath>
#include <limits>

namespace moetier {

namespace {

using nlohmann::json;

// Reads optional or required keys with one error style: "config.json: field 'x' ...".
class Reader {
 public:
  Reader(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool Has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  Status Int(const std::string& key, int64_t& out, bool required) const {
    if (!Has(key)) {
      return required ? Error("missing required field '" + key + "'") : OkStatus();
    }
    const json& v = j_[key];
    if (!v.is_number_integer()) return Error("field '" + key + "' must be an integer");
    out = v.get<int64_t>();
    return OkStatus();
  }
  Status Double(const json& v, const std::string& key, double& out) const {
    if (!v.is_number()) return Error("field '" + key + "' must be a number");
    out = v.get<double>();
    return OkStatus();
  }
  Status Bool(const std::string& key, bool& out) const {
    if (!Has(key)) return OkStatus();
    if (!j_[key].is_boolean()) return Error("field '" + key + "' must be true or false");
    out = j_[key].get<bool>();
    return OkStatus();
  }
  Status Error(const std::string& what) const { return Status::Error(source_ + ": " + what); }
  const json& j() const { return j_; }

 private:
  const json& j_;
  const std::string& source_;
};

Status ReadIdList(const Reader& r, const std::string& key, std::vector<int32_t>& out) {
  if (!r.Has(key)) return OkStatus();
  const json& v = r.j()[key];
  auto push = [&](const json& e) {
    if (!e.is_number_integer()) return r.Error("field '" + key + "' must hold integers");
    const int64_t id = e.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      return r.Error("field '" + key + "' holds " + e.dump() + ", not a token id");
    out.push_back(static_cast<int32_t>(id));
    return OkStatus();
  };
  if (v.is_number_integer()) {
    MT_RETURN_IF_ERROR(push(v));
  } else if (v.is_array()) {
    for (const auto& e : v) MT_RETURN_IF_ERROR(push(e));
  } else {
    return r.Error("field '" + key + "' must be an integer or a list of integers");
  }
  return OkStatus();
}

Status ReadRope(const Reader& r, const ConfigDefaults& defaults, ModelConfig& c) {
  c.rope_theta = defaults.rope_theta;
  if (r.Has("rope_theta"))
    MT_RETURN_IF_ERROR(r.Double(r.j()["rope_theta"], "rope_theta", c.rope_theta));
  // Newer checkpoints spell rope settings as rope_parameters: {rope_theta, rope_type, ...};
  // older ones use rope_scaling for the non-default kinds.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!r.Has(key)) continue;
    const json& p = r.j()[key];
    if (!p.is_object()) return r.Error(std::string("field '") + key + "' must be an object");
    if (p.contains("rope_theta"))
      MT_RETURN_IF_ERROR(r.Double(p["rope_theta"], std::string(key) + ".rope_theta", c.rope_theta));
    std::string type = "default";
    for (const char* tkey : {"rope_type", "type"})
      if (p.contains(tkey) && p[tkey].is_string()) type = p[tkey].get<std::string>();
    if (type != "default")
      return r.Error(std::string("field '") + key + "' asks for rope type '" + type +
                     "', which this architecture does not support yet (only 'default')");
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    return r.Error("rope_theta must be a positive number (is " + std::to_string(c.rope_theta) +
                   ")");
  return OkStatus();
}

// The values that are well-typed but impossible: each would give NaN outputs, an empty context
// or an id outside the vocabulary rather than an error.
Status CheckValues(const Reader& r, const ModelConfig& c) {
  // RMSNorm divides by sqrt(mean(x^2) + eps): eps <= 0 gives inf or NaN on a zero row.
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
    return r.Error("rms_norm_eps must be a small positive number such as 1e-6 (is " +
                   std::to_string(c.rms_norm_eps) + ")");
  if (r.Has("max_position_embeddings") && c.max_position_embeddings <= 0)
    return r.Error("max_position_embeddings must be positive (is " +
                   std::to_string(c.max_position_embeddings) + ")");
  if (c.dense_intermediate_size < 0) return r.Error("intermediate_size must not be negative");
  auto check_ids = [&](const char* key, const std::vector<int32_t>& ids) {
    for (int32_t id : ids)
      if (id >= c.vocab_size)
        return r.Error(std::string("field '") + key + "' holds " + std::to_string(id) +
                       ", outside the vocabulary of " + std::to_string(c.vocab_size) + " tokens");
    return OkStatus();
  };
  MT_RETURN_IF_ERROR(check_ids("eos_token_id", c.eos_token_ids));
  if (c.bos_token_id) MT_RETURN_IF_ERROR(check_ids("bos_token_id", {*c.bos_token_id}));
  return OkStatus();
}

std::optional<DType> DTypeFromTorchName(const std::string& s) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  if (s == "float32") return DType::kF32;
  return std::nullopt;
}

}  // namespace

Expected<std::string> ReadArchitectureName(const json& config, const std::string& source) {
  if (!config.is_object() || !config.contains("architectures") ||
      !config["architectures"].is_array() || config["architectures"].empty() ||
      !config["architectures"][0].is_string())
    return Status::Error(source +
                         ": missing field 'architectures' (a list naming the model class)");
  return config["architectures"][0].get<std::string>();
}

Expected<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source,
                                       const ConfigDefaults& defaults) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return Status::Error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return Status::Error(source + ": not a JSON object");
  Reader r(j, source);
  ModelConfig c;
  c.source = source;
  MT_ASSIGN_OR_RETURN(c.architecture, ReadArchitectureName(j, source));

  MT_RETURN_IF_ERROR(r.Int("vocab_size", c.vocab_size, true));
  MT_RETURN_IF_ERROR(r.Int("hidden_size", c.hidden_size, true));
  MT_RETURN_IF_ERROR(r.Int("num_hidden_layers", c.n_layers, true));
  MT_RETURN_IF_ERROR(r.Int("num_attention_heads", c.n_heads, true));
  c.n_kv_heads = c.n_heads;
  MT_RETURN_IF_ERROR(r.Int("num_key_value_heads", c.n_kv_heads, false));
  if (c.n_heads <= 0) return r.Error("num_attention_heads must be positive");
  c.head_dim = c.hidden_size / c.n_heads;
  MT_RETURN_IF_ERROR(r.Int("head_dim", c.head_dim, false));
  MT_RETURN_IF_ERROR(r.Int("intermediate_size", c.dense_intermediate_size, false));

  bool found_width = false;
  for (const auto& key : defaults.expert_width_keys) {
    if (r.Has(key)) {
      MT_RETURN_IF_ERROR(r.Int(key, c.expert_intermediate_size, true));
      found_width = true;
      break;
    }
  }
  if (!found_width)
    return r.Error("missing required field '" + defaults.expert_width_keys[0] + "'");

  if (r.Has("num_experts")) {
    MT_RETURN_IF_ERROR(r.Int("num_experts", c.n_experts, true));
  } else {
    MT_RETURN_IF_ERROR(r.Int("num_local_experts", c.n_experts, true));
  }
  MT_RETURN_IF_ERROR(r.Int("num_experts_per_tok", c.n_experts_per_token, true));
  c.norm_topk_prob = defaults.norm_topk_prob;
  MT_RETURN_IF_ERROR(r.Bool("norm_topk_prob", c.norm_topk_prob));
  c.tie_word_embeddings = defaults.tie_word_embeddings;
  MT_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", c.tie_word_embeddings));
  MT_RETURN_IF_ERROR(r.Bool("attention_bias", c.attention_bias));
  MT_RETURN_IF_ERROR(r.Int("max_position_embeddings", c.max_position_embeddings, false));

  if (r.Has("rms_norm_eps"))
    MT_RETURN_IF_ERROR(r.Double(j["rms_norm_eps"], "rms_norm_eps", c.rms_norm_eps));
  MT_RETURN_IF_ERROR(ReadRope(r, defaults, c));

  if (r.Has("hidden_act") && j["hidden_act"] != "silu")
    return r.Error("field 'hidden_act' is " + j["hidden_act"].dump() +
                   "; only \"silu\" is supported");

  bool use_window = !defaults.sliding_window_needs_flag;
  MT_RETURN_IF_ERROR(r.Bool("use_sliding_window", use_window));
  if (use_window) MT_RETURN_IF_ERROR(r.Int("sliding_window", c.sliding_window, false));
  if (c.sliding_window < 0) return r.Error("field 'sliding_window' must not be negative");

  for (const char* key : {"torch_dtype", "dtype"}) {
    if (r.Has(key) && j[key].is_string()) {
      auto d = DTypeFromTorchName(j[key].get<std::string>());
      if (!d)
        return r.Error(std::string("field '") + key + "' is " + j[key].dump() +
                       "; expected bfloat16, float16 or float32");
      c.declared_dtype = d;
    }
  }

  MT_RETURN_IF_ERROR(ReadIdList(r, "eos_token_id", c.eos_token_ids));
  std::vector<int32_t> bos;
  MT_RETURN_IF_ERROR(ReadIdList(r, "bos_token_id", bos));
  if (!bos.empty()) c.bos_token_id = bos[0];

  // Sizes must be positive and consistent before anything is allocated from them.
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size},       {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.n_layers},  {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},           {"expert width", c.expert_intermediate_size},
      {"number of experts", c.n_experts}, {"num_experts_per_tok", c.n_experts_per_token}};
  for (const auto& [name, v] : positive)
    if (v <= 0)
      return r.Error(std::string(name) + " must be positive (is " + std::to_string(v) + ")");
  if (c.n_heads % c.n_kv_heads != 0)
    return r.Error("num_attention_heads (" + std::to_string(c.n_heads) +
                   ") must be a multiple of num_key_value_heads (" + std::to_string(c.n_kv_heads) +
                   ")");
  if (c.head_dim % 2 != 0) return r.Error("head_dim must be even for rotary embeddings");
  if (c.n_experts_per_token > c.n_experts)
    return r.Error("num_experts_per_tok (" + std::to_string(c.n_experts_per_token) +
                   ") exceeds the number of experts (" + std::to_string(c.n_experts) + ")");
  MT_RETURN_IF_ERROR(CheckValues(r, c));
  // A generous cap that keeps a corrupt config from asking for absurd allocations.
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  for (int64_t v : {c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.head_dim,
                    c.expert_intermediate_size, c.dense_intermediate_size, c.n_experts})
    if (v > kMaxDim) return r.Error("a size in the config exceeds " + std::to_string(kMaxDim));
  if (c.n_heads * c.head_dim > kMaxDim)
    return r.Error("num_attention_heads x head_dim exceeds " + std::to_string(kMaxDim));

  c.layer_is_moe.assign(static_cast<size_t>(c.n_layers), true);
  if (defaults.has_dense_layer_keys) {
    int64_t step = 1;
    MT_RETURN_IF_ERROR(r.Int("decoder_sparse_step", step, false));
    if (step <= 0) return r.Error("field 'decoder_sparse_step' must be positive");
    for (int64_t l = 0; l < c.n_layers; ++l)
      c.layer_is_moe[static_cast<size_t>(l)] = (l + 1) % step == 0;
    if (r.Has("mlp_only_layers")) {
      const json& m = j["mlp_only_layers"];
      if (!m.is_array()) return r.Error("field 'mlp_only_layers' must be a list of layer ids");
      for (const auto& e : m) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.n_layers)
          return r.Error("field 'mlp_only_layers' holds " + e.dump() + ", not a layer id in [0, " +
                         std::to_string(c.n_layers) + ")");
        c.layer_is_moe[e.get<size_t>()] = false;
      }
    }
    for (int64_t l = 0; l < c.n_layers; ++l)
      if (!c.layer_is_moe[static_cast<size_t>(l)] && c.dense_intermediate_size <= 0)
        return r.Error("layer " + std::to_string(l) +
                       " is dense but 'intermediate_size' is missing");
  }
  return c;
}

}  // namespace moetier
