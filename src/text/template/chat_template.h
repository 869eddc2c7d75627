// Chat templates: the Jinja template a checkpoint ships (chat_template.jinja, or the
// "chat_template" field of tokenizer_config.json) rendered for a conversation with the context
// transformers' apply_chat_template gives it, so the prompt text is the one the model was
// trained on.
#pragma once

#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "text/template/jinja.h"

namespace moetier::text {

struct ChatTemplateInputs {
  nlohmann::ordered_json messages;  // [{"role": ..., "content": ...}, ...] as in the OpenAI API
  nlohmann::ordered_json tools;     // list of tool schemas; null when absent
  bool add_generation_prompt = false;
  // Any other template variables (e.g. {"enable_thinking": false}); an object or null.
  nlohmann::ordered_json extra;
  // What strftime_now() returns the time of; the local wall clock when unset.
  std::optional<std::tm> now;
};

class ChatTemplate {
 public:
  // Finds the template in model_dir: chat_template.jinja if present, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {"name", "template"} from which "tool_use" is chosen
  // when tools are given and "default" otherwise, as transformers does), else chat_template.json.
  // Special tokens (bos/eos/unk/pad) come from tokenizer_config.json, as strings or as
  // AddedToken objects {"content": ...}. Errors name the file.
  static Expected<ChatTemplate> Load(const std::filesystem::path& model_dir);

  // One template; special_tokens is {"bos_token": "<s>", ...} (null entries are left out).
  static Expected<ChatTemplate> FromSource(std::string source,
                                           nlohmann::ordered_json special_tokens);

  // Renders with the context transformers builds: messages, tools (null when absent),
  // documents (null), add_generation_prompt, the special tokens, then `extra`.
  // Errors: "chat template line N: <what>", or "chat template raised: <message>" when the template
  // rejects the conversation with raise_exception.
  Expected<std::string> Render(const ChatTemplateInputs& inputs) const;
  Expected<std::string> Render(const ChatTemplateInputs& inputs,
                               const jinja::RenderLimits& limits) const;

  // The context Render passes to the template (for tools that render it elsewhere).
  Expected<nlohmann::ordered_json> BuildContext(const ChatTemplateInputs& inputs) const;

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // The template's source text (for a checkpoint with several named templates, all of them, one
  // after another): what tells which markup the model's tool calls take.
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  Expected<const jinja::Template*> Select(bool has_tools) const;

  std::vector<std::pair<std::string, jinja::Template>> templates_;  // by name; "default" first
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::string source_;
};

// bos_token, eos_token, unk_token, pad_token of a tokenizer_config.json object, as strings
// (AddedToken objects are reduced to their "content"; absent and null ones are left out).
Expected<nlohmann::ordered_json> SpecialTokensFromConfig(const nlohmann::ordered_json& config);

}  // namespace moetier::text
