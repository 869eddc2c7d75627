// Options shared by every command that loads a model, and the helpers that read them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
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

void AddModelOptions(CLI::App& cmd, ModelOptions& opts);
// The residency flags alone (for `plan`, which loads nothing).
void AddResidencyOptions(CLI::App& cmd, ModelOptions& opts);
Expected<ResidencyOptions> ToResidencyOptions(const ModelOptions& opts);

// Writes the model's residency report to --report FILE, if given.
Status WriteReport(const ModelOptions& opts, const ResidencyReport& report);

// Loads the model named by --model, with the threads of --threads and the residency flags, and
// writes --report when asked.
Expected<std::unique_ptr<CausalLM>> LoadModel(const ModelOptions& opts);

// The context length to allocate for `model` under --ctx-size.
int64_t ContextSize(const ModelOptions& opts, const CausalLM& model);

// Parses "3,17,42" (spaces allowed) into ids; errors name the flag and the bad item.
Expected<std::vector<int32_t>> ParseTokenList(const std::string& text, const std::string& flag);

}  // namespace moetier::cli
