#include "engine/text_generation.h"

#include <algorithm>

namespace moetier {

std::vector<int32_t> StopIdsFor(std::vector<int32_t> ids, const text::Tokenizer& tokenizer) {
  if (tokenizer.config().eos_token_id) ids.push_back(*tokenizer.config().eos_token_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Expected<TextGenerationResult> GenerateText(Engine& engine, std::span<const int32_t> prompt,
                                            const TextGenerationOptions& options,
                                            const TextCallback& on_text,
                                            const std::atomic<bool>* cancel) {
  RequestOptions request;
  request.prompt.assign(prompt.begin(), prompt.end());
  request.sampler = options.tokens.sampler;
  request.max_new_tokens = options.tokens.max_new_tokens;
  request.stop_ids = options.tokens.stop_ids;
  request.stop_strings = options.stop_strings;
  request.text = true;
  request.skip_special_tokens = options.skip_special_tokens;
  TextGenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  Status error;
  RequestId id = 0;
  bool cancelled = false;
  auto emit = [&](std::string_view piece) {
    if (piece.empty()) return;
    result.text += piece;
    if (on_text) on_text(piece);
  };
  id = engine.Submit(std::move(request), [&](const RequestEvent& e) {
    emit(e.text);
    if (e.kind == RequestEvent::Kind::kToken) {
      result.ids.push_back(e.token);
      if (!cancelled && cancel != nullptr && cancel->load()) {
        cancelled = true;
        engine.Cancel(id);
      }
      return;
    }
    result.reason = e.reason;
    result.usage = e.usage;
    result.timings = e.timings;
    error = e.status;
  });
  engine.RunUntilIdle();
  if (!error.ok()) return error;
  return result;
}

}  // namespace moetier
