// Text generation: a prompt's continuation as text, streamed as it is produced on the engine —
// never a broken UTF-8 sequence (a token may end mid-character) and never the start of what may
// turn out to be a stop string.
#pragma once

#include <atomic>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generate.h"
#include "engine/stop_strings.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier {

struct TextGenerationOptions {
  GenerateOptions tokens;
  std::vector<std::string> stop_strings;  // generation ends before the first occurrence
  bool skip_special_tokens = true;        // in the text (EOS and the like are not printed)
};

struct TextGenerationResult {
  std::vector<int32_t> ids;  // generated ids, a stop id included
  std::string text;          // the text handed out, stop string excluded
  StopReason reason = StopReason::kMaxTokens;
  int64_t prompt_tokens = 0;  // the prompt's length
  RequestUsage usage;
  RequestTimings timings;
};

using TextCallback = std::function<void(std::string_view piece)>;

// The ids that end generation for this model and tokenizer: generation_config.json / config.json
// EOS ids and the tokenizer's eos token.
std::vector<int32_t> StopIdsFor(std::vector<int32_t> model_eos, const text::Tokenizer& tokenizer);

// Generates from `prompt` on `engine` (which must have been made with a tokenizer), handing the
// text to on_text as it becomes final. `cancel`, when set, stops after the current token.
Expected<TextGenerationResult> GenerateText(Engine& engine, std::span<const int32_t> prompt,
                                            const TextGenerationOptions& options,
                                            const TextCallback& on_text,
                                            const std::atomic<bool>* cancel = nullptr);

}  // namespace moetier
