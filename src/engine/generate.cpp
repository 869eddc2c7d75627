#include "engine/generate.h"

#include <algorithm>

namespace moetier {

Expected<std::vector<int32_t>> Generate(CausalLM& model, KvCache& cache,
                                        std::span<const int32_t> prompt,
                                        const GenerateOptions& options,
                                        const TokenCallback& on_token) {
  if (prompt.empty()) return Status::Error("the prompt is empty; give at least one token");
  Sampler sampler(options.sampler);
  std::vector<float> logits;
  std::vector<int32_t> out;
  MT_RETURN_IF_ERROR(model.Forward(prompt, cache, LogitsFor::kLastToken, logits));
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t next = sampler.Sample(logits);
    out.push_back(next);
    if (on_token && !on_token(next)) break;
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end())
      break;
    if (i + 1 == options.max_new_tokens) break;
    const int32_t one[1] = {next};
    MT_RETURN_IF_ERROR(model.Forward(one, cache, LogitsFor::kLastToken, logits));
  }
  return out;
}

}  // namespace moetier
