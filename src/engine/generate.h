// Token-level generation: prefill the prompt, then decode one token at a time with the KV
// cache, calling back with each new token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "model/causal_lm.h"

namespace moetier {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

// Called with each generated token; return false to stop.
using TokenCallback = std::function<bool(int32_t token)>;

// Runs the prompt through `model` (appending to `cache`) and generates up to max_new_tokens.
// Returns the generated ids.
Expected<std::vector<int32_t>> Generate(CausalLM& model, KvCache& cache,
                                        std::span<const int32_t> prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token = nullptr);

}  // namespace moetier
