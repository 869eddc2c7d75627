// A chat: the conversation so far, rendered by the model's chat template, with the KV cache kept
// between turns (each turn runs only the tokens the cache does not hold yet).
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
  ChatSession(CausalLM& model, const text::Tokenizer& tokenizer, const text::ChatTemplate& chat,
              int64_t ctx_size, std::string system_prompt = "");

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
  int64_t ctx_size() const { return cache_.max_positions(); }

  // The prompt ids for the history plus a generation prompt (for tests).
  Expected<std::vector<int32_t>> PromptIds() const;

 private:
  CausalLM& model_;
  const text::Tokenizer& tokenizer_;
  const text::ChatTemplate& chat_;
  std::string system_prompt_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  KvCache cache_;
  std::vector<int32_t> cached_;  // the ids the cache holds, in order
};

}  // namespace moetier
