#include "engine/chat_session.h"

namespace moetier {

ChatSession::ChatSession(CausalLM& model, const text::Tokenizer& tokenizer,
                         const text::ChatTemplate& chat, int64_t ctx_size,
                         std::string system_prompt)
    : model_(model),
      tokenizer_(tokenizer),
      chat_(chat),
      system_prompt_(std::move(system_prompt)),
      cache_(model.NewCache(ctx_size)) {
  Reset();
}

void ChatSession::Reset() {
  messages_ = nlohmann::ordered_json::array();
  if (!system_prompt_.empty())
    messages_.push_back({{"role", "system"}, {"content", system_prompt_}});
  // The cache may keep its rows: the next prompt shares its first tokens with the old one, and
  // ReusablePrefix keeps exactly those.
}

Expected<std::vector<int32_t>> ChatSession::PromptIds() const {
  text::ChatTemplateInputs in;
  in.messages = messages_;
  in.tools = nullptr;
  in.add_generation_prompt = true;
  MT_ASSIGN_OR_RETURN(std::string prompt, chat_.Render(in));
  // The template writes any BOS itself; adding special tokens again would double it.
  return tokenizer_.Encode(prompt, /*add_special_tokens=*/false);
}

Expected<TextGenerationResult> ChatSession::Ask(const std::string& user_text,
                                                const TextGenerationOptions& options,
                                                const TextCallback& on_text,
                                                const std::atomic<bool>* cancel) {
  messages_.push_back({{"role", "user"}, {"content", user_text}});
  auto ids = PromptIds();
  if (!ids.ok()) {
    messages_.erase(messages_.size() - 1);
    return ids.status();
  }
  if (static_cast<int64_t>(ids->size()) >= cache_.max_positions()) {
    // No room for the prompt and an answer: the turn is not kept, so a /reset or a shorter
    // message can follow.
    messages_.erase(messages_.size() - 1);
    TextGenerationResult full;
    full.reason = StopReason::kContextFull;
    full.prompt_tokens = static_cast<int64_t>(ids->size());
    return full;
  }
  const size_t keep = ReusablePrefix(cached_, *ids);
  cache_.Truncate(static_cast<int64_t>(keep));
  cached_.resize(keep);
  auto result = GenerateText(model_, cache_, tokenizer_, *ids, options, on_text, cancel);
  if (!result.ok()) {
    messages_.erase(messages_.size() - 1);
    cache_.Truncate(0);
    cached_.clear();
    return result.status();
  }
  // The cache now holds the prompt and every generated token but the last (whose K/V is
  // written only when it is fed back).
  result->prompt_tokens = static_cast<int64_t>(ids->size());
  cached_ = *ids;
  cached_.insert(cached_.end(), result->ids.begin(), result->ids.end());
  cached_.resize(static_cast<size_t>(cache_.n_past()));
  messages_.push_back({{"role", "assistant"}, {"content", result->text}});
  return result;
}

}  // namespace moetier
