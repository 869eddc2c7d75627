#include "model/config.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>

namespace moetier {

using nlohmann::json;

Status ConfigReader::Int(const std::string& key, int64_t& out, FieldPresence presence) const {
  if (!Has(key)) {
    return presence == FieldPresence::kRequired ? Error("missing required field '" + key + "'")
                                                : OkStatus();
  }
  const json& v = j_[key];
  if (!v.is_number_integer()) return Error("field '" + key + "' must be an integer");
  // get<int64_t>() would wrap these to negative numbers, and the error would say so.
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Error("field '" + key + "' is " + v.dump() + ", too large");
  out = v.get<int64_t>();
  return OkStatus();
}

Status ConfigReader::Bool(const std::string& key, bool& out) const {
  if (!Has(key)) return OkStatus();
  if (!j_[key].is_boolean()) return Error("field '" + key + "' must be true or false");
  out = j_[key].get<bool>();
  return OkStatus();
}

Status ConfigReader::Double(const std::string& key, double& out) const {
  return Has(key) ? Number(j_[key], key, out) : OkStatus();
}

Status ConfigReader::Number(const json& v, const std::string& key, double& out) const {
  if (!v.is_number()) return Error("field '" + key + "' must be a number");
  out = v.get<double>();
  return OkStatus();
}

Status ConfigReader::Error(const std::string& what) const {
  return Status::Error(source_ + ": " + what);
}

namespace {

// A generous cap that keeps a corrupt config from asking for absurd allocations.
constexpr int64_t kMaxDim = int64_t{1} << 24;
// Token positions are int32 (backend/batch.h), and the attention kernels take the window as one.
constexpr int64_t kMaxPositions = std::numeric_limits<int32_t>::max();
// Sixteen times the largest open MoE checkpoints (~1T weights): with it, every byte count the
// loader derives from the config (banks, tensors, their sums, even as f32) fits int64 with
// room to spare, which the caps on single sizes alone do not promise (3 of them multiply).
constexpr int64_t kMaxModelWeights = int64_t{1} << 44;
// config.json's own fields nest a few levels at most. Deeper values are refused before an error
// message quotes one (json::dump recurses once per level and would overflow the stack).
constexpr int kMaxJsonDepth = 32;

// The keys rope settings may sit under: newer checkpoints spell them rope_parameters:
// {rope_theta, rope_type, ...}; older ones use rope_scaling for the non-default kinds.
constexpr const char* kRopeObjects[] = {"rope_parameters", "rope_scaling"};

Status ReadIdList(const ConfigReader& r, const std::string& key, std::vector<int32_t>& out) {
  if (!r.Has(key)) return OkStatus();
  const json& v = r.object()[key];
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

// Sizes and heads. head_dim defaults to hidden_size / num_attention_heads.
Status ReadSizes(const ConfigReader& r, ModelConfig& c) {
  MT_RETURN_IF_ERROR(r.Int("vocab_size", c.vocab_size, FieldPresence::kRequired));
  MT_RETURN_IF_ERROR(r.Int("hidden_size", c.hidden_size, FieldPresence::kRequired));
  MT_RETURN_IF_ERROR(r.Int("num_hidden_layers", c.n_layers, FieldPresence::kRequired));
  MT_RETURN_IF_ERROR(r.Int("num_attention_heads", c.n_heads, FieldPresence::kRequired));
  c.n_kv_heads = c.n_heads;
  MT_RETURN_IF_ERROR(r.Int("num_key_value_heads", c.n_kv_heads, FieldPresence::kOptional));
  if (c.n_heads <= 0) return r.Error("num_attention_heads must be positive");
  c.head_dim = c.hidden_size / c.n_heads;
  MT_RETURN_IF_ERROR(r.Int("head_dim", c.head_dim, FieldPresence::kOptional));
  MT_RETURN_IF_ERROR(
      r.Int("intermediate_size", c.dense_intermediate_size, FieldPresence::kOptional));
  MT_RETURN_IF_ERROR(r.Int("num_experts_per_tok", c.n_experts_per_token, FieldPresence::kRequired));
  return r.Int("max_position_embeddings", c.max_position_embeddings, FieldPresence::kOptional);
}

Status ReadRope(const ConfigReader& r, ModelConfig& c) {
  MT_RETURN_IF_ERROR(r.Double("rope_theta", c.rope_theta));
  for (const char* key : kRopeObjects) {
    if (!r.Has(key)) continue;
    const json& p = r.object()[key];
    if (!p.is_object()) return r.Error(std::string("field '") + key + "' must be an object");
    if (p.contains("rope_theta"))
      MT_RETURN_IF_ERROR(r.Number(p["rope_theta"], std::string(key) + ".rope_theta", c.rope_theta));
    std::string type = "default";
    for (const char* tkey : {"rope_type", "type"})
      if (p.contains(tkey) && p[tkey].is_string()) type = p[tkey].get<std::string>();
    if (type != "default")
      return r.Error(std::string("field '") + key + "' asks for rope type '" + type +
                     "', which this architecture does not support yet (only 'default')");
  }
  return OkStatus();
}

std::optional<DType> DTypeFromTorchName(const std::string& s) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  if (s == "float32") return DType::kF32;
  return std::nullopt;
}

Status ReadDeclaredDType(const ConfigReader& r, ModelConfig& c) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    const json& j = r.object();
    if (r.Has(key) && j[key].is_string()) {
      auto d = DTypeFromTorchName(j[key].get<std::string>());
      if (!d)
        return r.Error(std::string("field '") + key + "' is " + j[key].dump() +
                       "; expected bfloat16, float16 or float32");
      c.declared_dtype = d;
    }
  }
  return OkStatus();
}

// The keys every architecture spells the same way.
Status ReadSharedFields(const ConfigReader& r, ModelConfig& c) {
  MT_RETURN_IF_ERROR(ReadSizes(r, c));
  MT_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", c.tie_word_embeddings));
  MT_RETURN_IF_ERROR(r.Bool("attention_bias", c.attention_bias));
  MT_RETURN_IF_ERROR(r.Double("rms_norm_eps", c.rms_norm_eps));
  MT_RETURN_IF_ERROR(ReadRope(r, c));
  const json& j = r.object();
  if (r.Has("hidden_act") && j["hidden_act"] != "silu")
    return r.Error("field 'hidden_act' is " + j["hidden_act"].dump() +
                   "; only \"silu\" is supported");
  MT_RETURN_IF_ERROR(ReadDeclaredDType(r, c));
  MT_RETURN_IF_ERROR(ReadIdList(r, "eos_token_id", c.eos_token_ids));
  std::vector<int32_t> bos;
  MT_RETURN_IF_ERROR(ReadIdList(r, "bos_token_id", bos));
  if (!bos.empty()) c.bos_token_id = bos[0];
  return OkStatus();
}

// The values that are well-typed but impossible: each would give NaN outputs, an empty context
// or an id outside the vocabulary rather than an error.
Status CheckValues(const ConfigReader& r, const ModelConfig& c) {
  // RMSNorm divides by sqrt(mean(x^2) + eps): eps <= 0 gives inf or NaN on a zero row.
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
    return r.Error("rms_norm_eps must be a small positive number such as 1e-6 (is " +
                   std::to_string(c.rms_norm_eps) + ")");
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    return r.Error("rope_theta must be a positive number (is " + std::to_string(c.rope_theta) +
                   ")");
  if (r.Has("max_position_embeddings") &&
      (c.max_position_embeddings <= 0 || c.max_position_embeddings > kMaxPositions))
    return r.Error("max_position_embeddings must be positive and at most " +
                   std::to_string(kMaxPositions) + " (is " +
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

// The product of non-negative factors, or INT64_MAX when it overflows: past any cap either way.
int64_t SaturatingProduct(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return std::numeric_limits<int64_t>::max();
  return p;
}

int64_t SaturatingSum(std::initializer_list<int64_t> terms) {
  int64_t s = 0;
  for (int64_t t : terms)
    if (__builtin_add_overflow(s, t, &s)) return std::numeric_limits<int64_t>::max();
  return s;
}

// Each top-level field nests at most kMaxJsonDepth levels; the error names the first that does
// not. Iterative, so that the check itself cannot overflow the stack.
Status CheckDepth(const ConfigReader& r) {
  for (const auto& [key, value] : r.object().items()) {
    std::vector<std::pair<const json*, int>> stack = {{&value, 1}};
    while (!stack.empty()) {
      const auto [node, depth] = stack.back();
      stack.pop_back();
      if (depth > kMaxJsonDepth)
        return r.Error("field '" + key + "' is nested deeper than " +
                       std::to_string(kMaxJsonDepth) + " levels");
      if (node->is_structured())
        for (const json& child : *node) stack.emplace_back(&child, depth + 1);
    }
  }
  return OkStatus();
}

Status CheckPositive(const ConfigReader& r, const char* name, int64_t v) {
  if (v > 0) return OkStatus();
  return r.Error(std::string(name) + " must be positive (is " + std::to_string(v) + ")");
}

// The shared sizes must be positive, consistent and bounded before the architecture's part
// allocates from them (layer_is_moe from n_layers).
Status CheckSharedSizes(const ConfigReader& r, const ModelConfig& c) {
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size},      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.n_layers}, {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},          {"num_experts_per_tok", c.n_experts_per_token}};
  for (const auto& [name, v] : positive) MT_RETURN_IF_ERROR(CheckPositive(r, name, v));
  if (c.n_heads % c.n_kv_heads != 0)
    return r.Error("num_attention_heads (" + std::to_string(c.n_heads) +
                   ") must be a multiple of num_key_value_heads (" + std::to_string(c.n_kv_heads) +
                   ")");
  if (c.head_dim % 2 != 0) return r.Error("head_dim must be even for rotary embeddings");
  MT_RETURN_IF_ERROR(CheckValues(r, c));
  for (int64_t v :
       {c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.head_dim, c.dense_intermediate_size})
    if (v > kMaxDim) return r.Error("a size in the config exceeds " + std::to_string(kMaxDim));
  if (c.n_heads * c.head_dim > kMaxDim)
    return r.Error("num_attention_heads x head_dim exceeds " + std::to_string(kMaxDim));
  return OkStatus();
}

// The weights the config describes, in two parts so the error names the fields that multiply:
// each is at most kMaxModelWeights. Every single size is at most kMaxDim already (and positive,
// but for intermediate_size, which may be 0).
Status CheckWeightCount(const ConfigReader& r, const ModelConfig& c) {
  const int64_t H = c.hidden_size, L_moe = c.n_moe_layers(), L_dense = c.n_layers - L_moe;
  const std::string cap = std::to_string(kMaxModelWeights);
  // gate, up and down of each expert, and the router [n_experts, H], in each MoE layer.
  const int64_t experts =
      SaturatingSum({SaturatingProduct({3, H, c.expert_intermediate_size, c.n_experts, L_moe}),
                     SaturatingProduct({c.n_experts, H, L_moe})});
  if (experts > kMaxModelWeights)
    return r.Error("the routed experts, 3 x hidden_size (" + std::to_string(H) +
                   ") x expert width (" + std::to_string(c.expert_intermediate_size) + ") x " +
                   std::to_string(c.n_experts) + " experts x " + std::to_string(L_moe) +
                   " MoE layers, exceed " + cap + " weights");
  // The embedding and lm_head [vocab, H]; q and o [n_heads * head_dim, H], k and v
  // [n_kv_heads * head_dim, H] in every layer; gate, up and down of each dense MLP.
  const int64_t rest =
      SaturatingSum({SaturatingProduct({2, c.vocab_size, H}),
                     SaturatingProduct({2, H, c.head_dim, c.n_heads + c.n_kv_heads, c.n_layers}),
                     SaturatingProduct({3, H, c.dense_intermediate_size, L_dense})});
  if (rest > kMaxModelWeights)
    return r.Error(
        "the weights besides the experts (from vocab_size, hidden_size, "
        "num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim and "
        "intermediate_size) exceed " +
        cap + " weights");
  return OkStatus();
}

// What the architecture's part resolved: the experts, the window, which layers are MoE.
Status CheckArchFields(const ConfigReader& r, const ModelConfig& c) {
  MT_RETURN_IF_ERROR(CheckPositive(r, "expert width", c.expert_intermediate_size));
  MT_RETURN_IF_ERROR(CheckPositive(r, "number of experts", c.n_experts));
  if (c.n_experts_per_token > c.n_experts)
    return r.Error("num_experts_per_tok (" + std::to_string(c.n_experts_per_token) +
                   ") exceeds the number of experts (" + std::to_string(c.n_experts) + ")");
  for (int64_t v : {c.expert_intermediate_size, c.n_experts})
    if (v > kMaxDim) return r.Error("a size in the config exceeds " + std::to_string(kMaxDim));
  if (c.sliding_window < 0) return r.Error("field 'sliding_window' must not be negative");
  if (c.sliding_window > kMaxPositions)
    return r.Error("field 'sliding_window' is " + std::to_string(c.sliding_window) +
                   ", more than the " + std::to_string(kMaxPositions) +
                   " positions a sequence has");
  if (c.layer_is_moe.size() != static_cast<size_t>(c.n_layers))
    return r.Error(c.architecture + " did not say which of the " + std::to_string(c.n_layers) +
                   " layers are MoE");
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (!c.layer_is_moe[static_cast<size_t>(l)] && c.dense_intermediate_size <= 0)
      return r.Error("layer " + std::to_string(l) + " is dense but 'intermediate_size' is missing");
  return CheckWeightCount(r, c);
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

bool DeclaresRopeTheta(const json& config) {
  if (!config.is_object()) return false;
  if (config.contains("rope_theta") && !config["rope_theta"].is_null()) return true;
  for (const char* key : kRopeObjects)
    if (config.contains(key) && config[key].is_object() && config[key].contains("rope_theta"))
      return true;
  return false;
}

Expected<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source,
                                       ArchConfigParser parse_arch) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return Status::Error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return Status::Error(source + ": not a JSON object");
  const ConfigReader r(j, source);
  MT_RETURN_IF_ERROR(CheckDepth(r));
  ModelConfig c;
  c.source = source;
  MT_ASSIGN_OR_RETURN(c.architecture, ReadArchitectureName(j, source));
  MT_RETURN_IF_ERROR(ReadSharedFields(r, c));
  MT_RETURN_IF_ERROR(CheckSharedSizes(r, c));
  MT_RETURN_IF_ERROR(parse_arch(j, source, c));
  MT_RETURN_IF_ERROR(CheckArchFields(r, c));
  return c;
}

}  // namespace moetier
