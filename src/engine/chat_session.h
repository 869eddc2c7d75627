// A chat: the conversation so far, rendered by the model's chat template. Each turn submits the
// whole conversation to the engine, whose prefix cache holds the earlier turns' K/V, so a turn
// runs only what the cache does not hold yet.
#pragma once

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/text_generation.h"
#include "text/template/chat_template.h"

namespace moetier {

class ChatSession {
 public:
  // `engine` must have been made with `tokenizer`.
  ChatSession(Engine& engine, const text::Tokenizer& tokenizer, const text::ChatTemplate& chat,
              std::string system_prompt = "");

  // Adds the user's message, generates the answer (streamed through on_text) and adds it to the
  // history. A cancelled answer is kept as far as it got. When the conversation with the new
  // message leaves no room in the context for an answer, nothing is generated or kept and the
  // reason is kContextFull with no ids (Reset() or a larger context is the way on).
  Expected<TextGenerationResult> Ask(const std::string& user_text,
                                     const TextGenerationOptions& options,
                                     const TextCallback& on_text, const std::atomic<bool>* cancel);
  // Forgets the conversation (the system prompt stays).
  void Reset();
  size_t n_turns() const { return messages_.size(); }
  // The most positions the conversation may take.
  int64_t ctx_size() const { return engine_.sequence_limit(); }

  // The prompt ids for the history plus a generation prompt (for tests).
  Expected<std::vector<int32_t>> PromptIds() const;

 private:
  Engine& engine_;
  const text::Tokenizer& tokenizer_;
  const text::ChatTemplate& chat_;
  std::string system_prompt_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
};

}  // namespace moetier
