// Options shared by every command that loads a model, and the helpers that read them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/causal_lm.h"

namespace moetier::cli {

struct ModelOptions {
  std::string model_dir;
  int n_threads = 0;
  int64_t ctx_size = 0;  // 0: min(max_position_embeddings, kDefaultContext)
  // Residency flags (issue 4), as typed; parsed when the model loads.
  std::string backend = "auto";
  std::optional<double> pin_budget_gb, lock_budget_gb;
  std::string cpu_layers = "auto";
  std::string weight_packing = "auto";
  std::string dense_memory = "auto";
  bool no_verify = false;
  std::string report_path;  // --report FILE
};

// Default context length: enough for chat use without reserving the model's whole window.
inline constexpr int64_t kDefaultContext = 8192;
// The largest --ctx-size accepted before the model says its own limit (2^24 positions).
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

void AddModelOptions(CLI::App& cmd, ModelOptions& opts);
// The residency flags alone (for `plan`, which loads nothing).
void AddResidencyOptions(CLI::App& cmd, ModelOptions& opts);
Expected<ResidencyOptions> ToResidencyOptions(const ModelOptions& opts);

// Writes the model's residency report to --report FILE, if given.
Status WriteReport(const ModelOptions& opts, const ResidencyReport& report);

// A command's checks of what depends on the model (token ids, lengths), run once the config is
// read and before the weights load (LoadOptions::before_weights).
using BeforeWeights = std::function<Status(const ModelConfig&)>;

// Loads the model named by --model, with the threads of --threads and the residency flags, and
// writes --report when asked. --report's path, --ctx-size and `before_weights` are checked
// before a weight is read.
Expected<std::unique_ptr<CausalLM>> LoadModel(const ModelOptions& opts,
                                              const BeforeWeights& before_weights = nullptr);

// The context length to allocate under --ctx-size.
int64_t ContextSize(const ModelOptions& opts, const ModelConfig& config);
int64_t ContextSize(const ModelOptions& opts, const CausalLM& model);
// --ctx-size within the model's max_position_embeddings.
Status CheckContextSize(const ModelOptions& opts, const ModelConfig& config);
// Every id within the model's vocabulary; errors name `flag`.
Status CheckTokenIds(std::span<const int32_t> ids, const ModelConfig& config,
                     std::string_view flag);

// Parses "3,17,42" (spaces allowed) into ids; errors name the flag and the bad item.
Expected<std::vector<int32_t>> ParseTokenList(const std::string& text, const std::string& flag);

}  // namespace moetier::cli
