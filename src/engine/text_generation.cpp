#include "engine/text_generation.h"

#include <algorithm>

namespace moetier {

std::string StopStringFilter::Push(std::string_view piece) {
  if (stopped_) return "";
  pending_.append(piece);
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    if (at < first) first = at;
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::Flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  return out;
}

std::vector<int32_t> StopIdsFor(std::vector<int32_t> ids, const text::Tokenizer& tokenizer) {
  if (tokenizer.config().eos_token_id) ids.push_back(*tokenizer.config().eos_token_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Expected<TextGenerationResult> GenerateText(CausalLM& model, KvCache& cache,
                                            const text::Tokenizer& tokenizer,
                                            std::span<const int32_t> prompt,
                                            const TextGenerationOptions& options,
                                            const TextCallback& on_text,
                                            const std::atomic<bool>* cancel) {
  TextGenerationResult result;
  text::StreamDecoder decoder(tokenizer, options.skip_special_tokens);
  StopStringFilter stops(options.stop_strings);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    result.text += s;
    if (on_text) on_text(s);
  };
  const auto& stop_ids = options.tokens.stop_ids;
  bool stopped_by_string = false;
  auto on_token = [&](int32_t id) -> bool {
    // A stop id ends generation in Generate; its text is not part of the answer.
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) return true;
    emit(stops.Push(decoder.Push(id)));
    if (stops.stopped()) {
      stopped_by_string = true;
      return false;
    }
    return cancel == nullptr || !cancel->load();
  };
  MT_ASSIGN_OR_RETURN(GenerateResult generated,
                      Generate(model, cache, prompt, options.tokens, on_token));
  result.ids = std::move(generated.ids);
  result.reason = stopped_by_string ? StopReason::kStopString : generated.reason;
  if (!stops.stopped()) emit(stops.Push(decoder.Flush()));
  emit(stops.Flush());
  return result;
}

}  // namespace moetier
