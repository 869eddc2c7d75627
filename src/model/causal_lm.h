// CausalLM: a loaded model that turns token ids into logits, one architecture file each
// (model/arch/). Not thread-safe: one engine thread drives it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "layers/kv_cache.h"
#include "model/config.h"

namespace moetier {

enum class LogitsFor { kLastToken, kAllTokens };

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;

  // Runs `tokens` at positions cache.n_past() + t, appends their K/V to `cache` and writes
  // logits: [1, vocab] for kLastToken, [tokens.size(), vocab] for kAllTokens.
  virtual Status Forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                         std::vector<float>& logits) = 0;

  // When set, MoE layers store their raw router logits [n_tokens, n_experts] in (*sink)[layer]
  // on each Forward (for checks against reference router logits). nullptr turns it off.
  virtual void SetRouterLogitsSink(std::vector<std::vector<float>>* sink) = 0;

  // A cache for this model holding up to max_positions positions.
  KvCache NewCache(int64_t max_positions) const {
    const ModelConfig& c = config();
    return KvCache(c.n_layers, c.n_kv_heads, c.head_dim, max_positions);
  }
};

struct LoadOptions {
  int n_threads = 0;  // 0: every core the process may use
};

// Loads a Hugging Face model directory (config.json + safetensors): parses the config, picks the
// architecture, maps the weights and checks every tensor's presence, dtype and shape against the
// config before returning.
Expected<std::unique_ptr<CausalLM>> LoadCausalLM(const std::filesystem::path& dir,
                                                 const LoadOptions& options);

}  // namespace moetier
