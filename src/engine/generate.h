// Token-level generation: prefill the part of the prompt the KV cache does not hold yet, then
// decode one token at a time, calling back with each new token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
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

// Why generation ended. kContextFull: the next token would not fit the context (--ctx-size).
enum class StopReason { kEos, kStopString, kMaxTokens, kContextFull, kCancelled };
// The finish reason as the OpenAI API spells it: "stop" (an end-of-sequence token or a stop
// string), "length" (max tokens or the context's end) or "cancelled".
std::string_view StopReasonName(StopReason r);

// Called with each generated token; return false to stop (the caller knows why).
using TokenCallback = std::function<bool(int32_t token)>;

struct GenerateResult {
  std::vector<int32_t> ids;                    // generated ids, a stop id included
  StopReason reason = StopReason::kMaxTokens;  // kCancelled when on_token returned false
};

// `prompt` is the whole sequence; the cache must hold exactly its first cache.n_past() tokens
// (a fresh cache holds none; a chat reuses the turns before). Runs the rest, then generates up
// to max_new_tokens, stopping early at a stop id or where the context is full. A prompt that
// does not fit the context is an error that says by how much.
Expected<GenerateResult> Generate(CausalLM& model, KvCache& cache, std::span<const int32_t> prompt,
                                  const GenerateOptions& options,
                                  const TokenCallback& on_token = nullptr);

// The length of the common prefix of the cached tokens and `prompt`, cut so at least one prompt
// token is left to run (its logits start generation). Truncate the cache to it before Generate.
size_t ReusablePrefix(std::span<const int32_t> cached, std::span<const int32_t> prompt);

}  // namespace moetier
