// Text generation: token generation plus the tokenizer's streaming decoder and stop strings.
// Text is handed out as it is produced, never a broken UTF-8 sequence (a token may end
// mid-character), and never the start of what may turn out to be a stop string.
#pragma once

#include <atomic>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generate.h"
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
  int64_t prompt_tokens = 0;  // set by ChatSession: the rendered conversation's length
};

using TextCallback = std::function<void(std::string_view piece)>;

// Holds back text that may be the beginning of a stop string; finds the first stop string.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns what is now safe to emit. After a stop string, stopped() is true and the
  // returned text ends just before it.
  std::string Push(std::string_view piece);
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

// The ids that end generation for this model and tokenizer: generation_config.json / config.json
// EOS ids and the tokenizer's eos token.
std::vector<int32_t> StopIdsFor(std::vector<int32_t> model_eos, const text::Tokenizer& tokenizer);

// `prompt` and `cache` as for Generate. `cancel`, when set, stops after the current token.
Expected<TextGenerationResult> GenerateText(CausalLM& model, KvCache& cache,
                                            const text::Tokenizer& tokenizer,
                                            std::span<const int32_t> prompt,
                                            const TextGenerationOptions& options,
                                            const TextCallback& on_text,
                                            const std::atomic<bool>* cancel = nullptr);

}  // namespace moetier
