#include "engine/chat_session.h"

namespace moetier {

ChatSession::ChatSession(Engine& engine, const text::Tokenizer& tokenizer,
                         const text::ChatTemplate& chat, std::string system_prompt)
    : engine_(engine),
      tokenizer_(tokenizer),
      chat_(chat),
      system_prompt_(std::move(system_prompt)) {
  Reset();
}

void ChatSession::Reset() {
  messages_ = nlohmann::ordered_json::array();
  if (!system_prompt_.empty())
    messages_.push_back({{"role", "system"}, {"content", system_prompt_}});
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
  if (static_cast<int64_t>(ids->size()) >= ctx_size()) {
    // No room for the prompt and an answer: the turn is not kept, so a /reset or a shorter
    // message can follow.
    messages_.erase(messages_.size() - 1);
    TextGenerationResult full;
    full.reason = StopReason::kContextFull;
    full.prompt_tokens = static_cast<int64_t>(ids->size());
    return full;
  }
  auto result = GenerateText(engine_, *ids, options, on_text, cancel);
  if (!result.ok()) {
    messages_.erase(messages_.size() - 1);
    return result.status();
  }
  messages_.push_back({{"role", "assistant"}, {"content", result->text}});
  return result;
}

}  // namespace moetier
