// generation_config.json: the ids that end generation, merged with config.json's.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace moetier {

// EOS ids from `dir`/generation_config.json (when present) and from the model config, without
// duplicates. A malformed generation_config.json is an error naming it.
Expected<std::vector<int32_t>> ReadStopTokenIds(const std::filesystem::path& dir,
                                                const ModelConfig& config);

// The sampling defaults a checkpoint ships in generation_config.json (each absent when unset).
struct SamplingDefaults {
  std::optional<bool> do_sample;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
};
Expected<SamplingDefaults> ReadSamplingDefaults(const std::filesystem::path& dir);

}  // namespace moetier
