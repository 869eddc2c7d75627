#include "engine/generate.h"

#include <algorithm>

namespace moetier {

size_t ReusablePrefix(std::span<const int32_t> cached, std::span<const int32_t> prompt) {
  size_t n = 0;
  while (n < cached.size() && n < prompt.size() && cached[n] == prompt[n]) ++n;
  return prompt.empty() ? 0 : std::min(n, prompt.size() - 1);
}

std::string_view StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kEos:
    case StopReason::kStopString:
      return "stop";
    case StopReason::kMaxTokens:
    case StopReason::kContextFull:
      return "length";
    case StopReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

Expected<GenerateResult> Generate(CausalLM& model, KvCache& cache, std::span<const int32_t> prompt,
                                  const GenerateOptions& options, const TokenCallback& on_token) {
  if (prompt.empty()) return Status::Error("the prompt is empty; give at least one token");
  if (cache.n_past() >= static_cast<int64_t>(prompt.size()))
    return Status::Error("the KV cache already holds the whole prompt; truncate it first");
  if (static_cast<int64_t>(prompt.size()) > cache.max_positions())
    return Status::Error("the prompt has " + std::to_string(prompt.size()) +
                         " tokens but the context holds " + std::to_string(cache.max_positions()) +
                         "; raise --ctx-size or shorten the prompt");
  MT_RETURN_IF_ERROR(ValidateSamplerOptions(options.sampler));
  Sampler sampler(options.sampler);
  std::vector<float> logits;
  GenerateResult out;
  // The repetition penalty looks at the whole context: prompt and generated ids.
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  MT_RETURN_IF_ERROR(model.Forward(prompt.subspan(static_cast<size_t>(cache.n_past())), cache,
                                   LogitsFor::kLastToken, logits));
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    MT_ASSIGN_OR_RETURN(const int32_t next, sampler.Sample(logits, context));
    out.ids.push_back(next);
    context.push_back(next);
    if (on_token && !on_token(next)) {
      out.reason = StopReason::kCancelled;
      return out;
    }
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) !=
        options.stop_ids.end()) {
      out.reason = StopReason::kEos;
      return out;
    }
    if (i + 1 == options.max_new_tokens) break;
    // The token just sampled needs a position of its own to be run for the next one.
    if (cache.n_past() >= cache.max_positions()) {
      out.reason = StopReason::kContextFull;
      return out;
    }
    const int32_t one[1] = {next};
    MT_RETURN_IF_ERROR(model.Forward(one, cache, LogitsFor::kLastToken, logits));
  }
  out.reason = StopReason::kMaxTokens;
  return out;
}

}  // namespace moetier
