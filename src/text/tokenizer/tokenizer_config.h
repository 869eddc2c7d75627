// What tokenizer_config.json (transformers' side of a tokenizer) says that the engine needs:
// the named special tokens, whether Encode(add_special_tokens) adds BOS/EOS, and the chat
// template. A missing file gives the defaults below.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/json_fields.h"

namespace moetier::text {

struct TokenizerConfig {
  // Token strings; empty when the config does not name one (or names null).
  std::string bos_token;
  std::string eos_token;
  std::string unk_token;
  std::string pad_token;
  // Their ids in the loaded tokenizer; nullopt when unnamed or not in the vocabulary.
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> eos_token_id;
  std::optional<int32_t> unk_token_id;
  std::optional<int32_t> pad_token_id;
  std::vector<std::string> additional_special_tokens;

  // add_bos_token / add_eos_token. When the config names either key, transformers replaces the
  // tokenizer.json post-processor by "[bos] $A [eos]" built from them, and so do we.
  bool add_bos_token = false;
  bool add_eos_token = false;
  bool add_bos_eos_given = false;

  // transformers' clean_up_tokenization (" ." -> "." and friends) after decoding.
  bool clean_up_tokenization_spaces = false;

  // The "chat_template" value as JSON text: a JSON string, or a list of {"name", "template"}
  // objects; empty when there is none. chat_template.jinja beside the config, which newer
  // transformers write instead, is read as a JSON string.
  std::string chat_template_json;
  // The default template's text: the string itself, or the list entry named "default".
  std::string chat_template;
};

// Reads the fields above from the parsed file (ids are left unset; the loader fills them).
Expected<TokenizerConfig> ParseTokenizerConfig(const Json& j);

}  // namespace moetier::text
