#include "text/tokenizer/tokenizer_config.h"

namespace moetier::text {
namespace {

// A named token is a string, null, or an AddedToken object {"content": ..., ...}.
Expected<std::string> TokenName(const Json& j, std::string_view key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return RequiredString(*it, "content", key);
  return FieldError(key, "expected a string, null or {\"content\": ...}");
}

}  // namespace

Expected<TokenizerConfig> ParseTokenizerConfig(const Json& j) {
  TokenizerConfig c;
  if (!j.is_object()) return FieldError("", "expected a JSON object at the top level");
  MT_ASSIGN_OR_RETURN(c.bos_token, TokenName(j, "bos_token"));
  MT_ASSIGN_OR_RETURN(c.eos_token, TokenName(j, "eos_token"));
  MT_ASSIGN_OR_RETURN(c.unk_token, TokenName(j, "unk_token"));
  MT_ASSIGN_OR_RETURN(c.pad_token, TokenName(j, "pad_token"));
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array()) continue;
    for (const Json& t : *it) {
      if (t.is_string()) {
        c.additional_special_tokens.push_back(t.get<std::string>());
      } else if (t.is_object() && t.contains("content") && t["content"].is_string()) {
        c.additional_special_tokens.push_back(t["content"].get<std::string>());
      }
    }
  }
  c.add_bos_eos_given = j.contains("add_bos_token") || j.contains("add_eos_token");
  MT_ASSIGN_OR_RETURN(c.add_bos_token, OptionalBool(j, "add_bos_token", "", false));
  MT_ASSIGN_OR_RETURN(c.add_eos_token, OptionalBool(j, "add_eos_token", "", false));
  const char* clean_up = "clean_up_tokenization_spaces";
  MT_ASSIGN_OR_RETURN(c.clean_up_tokenization_spaces, OptionalBool(j, clean_up, "", false));

  if (const auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (const Json& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          return FieldError("chat_template", "expected a list of {\"name\", \"template\"}");
        }
        if (entry["name"].get<std::string>() == "default") {
          c.chat_template = entry["template"].get<std::string>();
        }
      }
    } else {
      return FieldError("chat_template", "expected a string or a list");
    }
    c.chat_template_json = it->dump();
  }
  return c;
}

}  // namespace moetier::text
