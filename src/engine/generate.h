// Generation for one prompt at a time, on the engine (engine/engine.h): what `generate`, `run`
// and tests use. The engine's other requests, if any, run beside it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/stop_reason.h"

namespace moetier {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplerOptions sampler;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
};

// Called with each generated token; return false to stop (the result says kCancelled).
using TokenCallback = std::function<bool(int32_t token)>;

struct GenerateResult {
  std::vector<int32_t> ids;  // generated ids, a stop id included
  StopReason reason = StopReason::kMaxTokens;
  RequestUsage usage;
  RequestTimings timings;
};

// Runs `prompt` (its longest cached prefix comes from the engine's prefix cache), then
// generates up to max_new_tokens, stopping early at a stop id or where the context is full;
// drives the engine on this thread until it is idle. A prompt that does not fit the context is
// an error that says by how much.
Expected<GenerateResult> Generate(Engine& engine, std::span<const int32_t> prompt,
                                  const GenerateOptions& options,
                                  const TokenCallback& on_token = nullptr);

}  // namespace moetier
