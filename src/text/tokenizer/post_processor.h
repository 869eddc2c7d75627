// What Encode(text, add_special_tokens=true) wraps around the ids of one sequence: the
// tokenizer.json "post_processor" (TemplateProcessing, RobertaProcessing, BertProcessing,
// ByteLevel, Sequence), or — as transformers does when tokenizer_config.json sets add_bos_token
// or add_eos_token — a template of [bos] $A [eos] built from those settings.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/json_fields.h"

namespace moetier::text {

class PostProcessor {
 public:
  // `j` is the value of "post_processor" (null means none).
  static Expected<PostProcessor> FromJson(const Json& j, std::string_view path);
  // The template transformers installs from add_bos_token / add_eos_token.
  static PostProcessor BosEos(std::vector<int32_t> bos_ids, std::vector<int32_t> eos_ids);

  std::vector<int32_t> Apply(std::vector<int32_t> ids) const;

 private:
  Status AddFromJson(const Json& j, std::string_view path);

  // Items of the single-sequence template, in order; an empty `ids` with `is_sequence` set
  // stands for the encoded text ($A).
  struct Item {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  // One template per processor that adds tokens; a Sequence applies them in order.
  std::vector<std::vector<Item>> templates_;
};

}  // namespace moetier::text
