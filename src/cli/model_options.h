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
#include "engine/engine.h"
#include "model/causal_lm.h"

namespace moetier::cli {

struct ModelOptions {
  std::string model_dir;
  int n_threads = 0;
  // The KV cache, shared by every sequence: --ctx-size positions in all (0: what the model's
  // window times the sequences and half the free RAM allow) or --kv-cache-gb, in --kv-dtype.
  int64_t ctx_size = 0;
  std::optional<double> kv_cache_gb;
  std::string kv_dtype;   // empty: f32 on the CPU, bf16 on the GPU
  double kv_host_gb = 0;  // --kv-host-gb: the host KV tier (0: none)
  // Residency flags, as typed; parsed when the model loads.
  std::string backend = "auto";
  std::optional<double> pin_budget_gb, lock_budget_gb;
  std::optional<double> moe_cache_gb;  // --moe-cache-gb (offload's VRAM expert cache)
  std::string cpu_layers = "auto";
  std::string weight_packing = "auto";
  std::string dense_memory = "auto";
  bool no_verify = false;
  bool no_gpu = false;         // --no-gpu
  std::string report_path;     // --report FILE
  bool collect_stats = false;  // --moe-collect-stats
};

// Tokens per engine step by default: a prompt chunk this long keeps the experts' reads shared
// by many tokens, and a decode step waits for at most one such chunk.
inline constexpr int64_t kDefaultMaxBatchTokens = 512;
// The largest --ctx-size accepted (2^26 positions).
inline constexpr int64_t kMaxContext = int64_t{1} << 26;
// The share of the RAM available after loading that the default KV cache may take.
inline constexpr double kDefaultKvRamShare = 0.5;

void AddModelOptions(CLI::App& cmd, ModelOptions& opts);
// The KV cache flags alone (AddModelOptions adds them).
void AddKvOptions(CLI::App& cmd, ModelOptions& opts);
// The residency flags alone (for `plan`, which loads nothing).
void AddResidencyOptions(CLI::App& cmd, ModelOptions& opts);
Expected<ResidencyOptions> ToResidencyOptions(const ModelOptions& opts);

// Writes the model's residency report to --report FILE, if given (with the expert stats when
// they are collected).
Status WriteReport(const ModelOptions& opts, const CausalLM& model);

// After a command's work: with --moe-collect-stats, their one-line summary on stderr and the
// report written again with them.
Status FinishModel(const ModelOptions& opts, const CausalLM& model);

// A command's checks of what depends on the model (token ids, lengths), run once the config is
// read and before the weights load (LoadOptions::before_weights).
using BeforeWeights = std::function<Status(const ModelConfig&)>;

// Loads the model named by --model, with the threads of --threads and the residency flags, and
// writes --report when asked. --report's path, --ctx-size and `before_weights` are checked
// before a weight is read.
Expected<std::unique_ptr<CausalLM>> LoadModel(const ModelOptions& opts,
                                              const BeforeWeights& before_weights = nullptr);

// The KV cache's format: --kv-dtype as given, else "f32" on the CPU and "bf16" on the GPU.
std::string KvDTypeName(const ModelOptions& opts, const CausalLM& model);
// The engine's options for `model` under the KV flags, with `parallel` sequences at once and
// steps of at most `max_batch_tokens`; logs the KV cache's size on one line.
Expected<EngineOptions> MakeEngineOptions(const ModelOptions& opts, const CausalLM& model,
                                          int parallel, int64_t max_batch_tokens);
// An engine for `model` under the flags (tokenizer: for text requests, or null).
Expected<std::unique_ptr<Engine>> MakeEngine(const ModelOptions& opts, CausalLM& model,
                                             const text::Tokenizer* tokenizer, int parallel = 1,
                                             int64_t max_batch_tokens = kDefaultMaxBatchTokens);
// Every id within the model's vocabulary; errors name `flag`.
Status CheckTokenIds(std::span<const int32_t> ids, const ModelConfig& config,
                     std::string_view flag);

// Parses "3,17,42" (spaces allowed) into ids; errors name the flag and the bad item.
Expected<std::vector<int32_t>> ParseTokenList(const std::string& text, const std::string& flag);

}  // namespace moetier::cli
