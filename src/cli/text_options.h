// Flags shared by the commands that produce text (generate --prompt, run): sampling, stop
// strings, length; and loading the tokenizer and chat template beside the model.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/text_generation.h"
#include "model/causal_lm.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::cli {

struct SamplingFlags {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<int64_t> seed;  // -1: random
  int64_t max_new_tokens = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

void AddSamplingFlags(CLI::App& cmd, SamplingFlags& f, int64_t default_max_new_tokens);

// The flags of the draw alone (--temperature, --top-k, --top-p, --min-p, --repetition-penalty)
// in group g, and the ones given written over s (the others leave s as it is).
void AddDrawFlags(CLI::Option_group& g, SamplingFlags& f);
void ApplyDrawFlags(const SamplingFlags& f, SamplerOptions& s);

// --seed, or a random one when it is absent or -1.
uint64_t SeedFrom(const SamplingFlags& f);

// The generation options: flags first, then (when use_model_defaults) the sampling defaults of
// generation_config.json, then greedy. Stop ids from the model and tokenizer unless --ignore-eos.
// Needs only the config, so it runs before the weights load (LoadModel's before_weights).
Expected<TextGenerationOptions> MakeTextOptions(const SamplingFlags& f,
                                                const std::string& model_dir,
                                                const ModelConfig& config,
                                                const text::Tokenizer& tokenizer,
                                                bool use_model_defaults);

}  // namespace moetier::cli
