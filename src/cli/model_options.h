// Options shared by every command that loads a model, and the helpers that read them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/causal_lm.h"

namespace moetier::cli {

struct ModelOptions {
  std::string model_dir;
  int n_threads = 0;
  int64_t ctx_size = 0;  // 0: min(max_position_embeddings, kDefaultContext)
};

// Default context length: enough for chat use without reserving the model's whole window.
inline constexpr int64_t kDefaultContext = 8192;

void AddModelOptions(CLI::App& cmd, ModelOptions& opts);

// Loads the model named by --model, with the threads of --threads.
Expected<std::unique_ptr<CausalLM>> LoadModel(const ModelOptions& opts);

// The context length to allocate for `model` under --ctx-size.
int64_t ContextSize(const ModelOptions& opts, const CausalLM& model);

// Parses "3,17,42" (spaces allowed) into ids; errors name the flag and the bad item.
Expected<std::vector<int32_t>> ParseTokenList(const std::string& text, const std::string& flag);

}  // namespace moetier::cli
