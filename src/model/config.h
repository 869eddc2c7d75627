// ModelConfig: what the forward needs from config.json, architecture-neutral. The shared parser
// reads the keys every architecture spells the same way (sizes, heads, norms, RoPE, dtype, token
// ids); each architecture file (model/arch/) reads its own spellings and switches and resolves
// them into the same fields (the expert count and width, which layers are MoE, the attention
// window), so model code reads one name per setting.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace moetier {

struct ModelConfig {
  std::string architecture;  // e.g. "Qwen3MoeForCausalLM"
  std::string source;        // the config.json path, for error messages

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;  // d_model
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t dense_intermediate_size = 0;   // width of a dense (non-MoE) MLP
  int64_t expert_intermediate_size = 0;  // width of one routed expert
  int64_t n_experts = 0;
  int64_t n_experts_per_token = 0;  // top-k
  bool norm_topk_prob = true;       // renormalise the top-k routing weights to sum to 1
  std::vector<bool> layer_is_moe;   // [n_layers]
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  int64_t sliding_window = 0;  // 0: attend to every earlier position
  int64_t max_position_embeddings = 0;
  std::optional<DType> declared_dtype;  // torch_dtype / dtype, when given
  // Set for a converted model whose index says `moetier convert --dense-dtype` stored dense
  // matrices as this dtype (config.json is copied unchanged, so it still declares the
  // checkpoint's): WeightBinder accepts it beside declared_dtype.
  std::optional<DType> converted_dense_dtype;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;

  int64_t n_moe_layers() const {
    int64_t n = 0;
    for (bool m : layer_is_moe) n += m ? 1 : 0;
    return n;
  }
};

enum class FieldPresence { kOptional, kRequired };

// Reads config.json's fields with one error style, "<path>/config.json: field 'x' must be ...":
// the shared parser and every architecture's own (ArchSpec::parse_config) read through it. An
// optional field that is absent or null leaves `out` as it was, so the caller sets the default
// first. The reader refers to `j` and `source`, which must outlive it.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}

  // Present and not null.
  bool Has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  Status Int(const std::string& key, int64_t& out, FieldPresence presence) const;
  Status Bool(const std::string& key, bool& out) const;      // optional
  Status Double(const std::string& key, double& out) const;  // optional
  // `v` as a number, `key` naming it in the error (a nested field: "rope_parameters.rope_theta").
  Status Number(const nlohmann::json& v, const std::string& key, double& out) const;
  // "<source>: <what>".
  Status Error(const std::string& what) const;

  // The config.json object.
  const nlohmann::json& object() const { return j_; }

 private:
  const nlohmann::json& j_;
  const std::string& source_;
};

// An architecture's own config.json keys, read into `c` after the shared ones were read and
// checked (so the sizes, n_layers among them, are valid). It must set n_experts,
// expert_intermediate_size and layer_is_moe [n_layers], and whatever else the architecture
// spells its own way or defaults differently (norm_topk_prob, sliding_window, rope_theta when
// config.json gives none). ParseModelConfig then checks what it set.
using ArchConfigParser = Status (*)(const nlohmann::json& j, const std::string& source,
                                    ModelConfig& c);

// Parses config.json text (`source` names the file in errors): the shared keys, then the
// architecture's (`parse_arch`). Validates that sizes are positive and consistent (heads divide,
// top-k <= experts) and bounded (each size, and the weights they describe summed over the
// model, so that byte counts derived from them fit int64; the context and the window fit int32),
// that values are usable (eps, rope_theta, token ids inside the vocabulary) and that the features
// used are supported.
Expected<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source,
                                       ArchConfigParser parse_arch);

// Reads `architectures[0]` of a parsed config.json, or fails naming the file.
Expected<std::string> ReadArchitectureName(const nlohmann::json& config, const std::string& source);

// Whether config.json gives rope_theta, under either spelling (`rope_theta`, or inside
// `rope_parameters` / `rope_scaling`): an architecture whose default differs from ModelConfig's
// sets its own only when it does not.
bool DeclaresRopeTheta(const nlohmann::json& config);

}  // namespace moetier
