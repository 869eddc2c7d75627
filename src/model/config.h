// ModelConfig: what the forward needs from config.json, with every key spelling real checkpoints
// use resolved here (`rope_theta` or `rope_parameters.rope_theta`, `num_experts` or
// `num_local_experts`), so model code reads one name per setting.
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

// Arch-specific defaults for keys a config may omit (each architecture file supplies its own,
// mirroring the defaults of its Hugging Face config class).
struct ConfigDefaults {
  bool norm_topk_prob = true;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  // Keys naming the expert width, first present wins.
  std::vector<std::string> expert_width_keys = {"moe_intermediate_size", "intermediate_size"};
  // Whether `mlp_only_layers` / `decoder_sparse_step` choose dense layers.
  bool has_dense_layer_keys = false;
  // Whether `sliding_window` applies only when `use_sliding_window` is true.
  bool sliding_window_needs_flag = false;
};

// Parses config.json text (`source` names the file in errors). Validates that sizes are positive
// and consistent (heads divide, top-k <= experts) and that the features used are supported.
Expected<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source,
                                       const ConfigDefaults& defaults);

// Reads `architectures[0]` of a parsed config.json, or fails naming the file.
Expected<std::string> ReadArchitectureName(const nlohmann::json& config, const std::string& source);

}  // namespace moetier
