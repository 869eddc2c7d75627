// Internal: everything a loaded tokenizer consists of, shared (read-only) by Tokenizer copies
// and StreamDecoders. Built once by the loader; never modified afterwards except for the BPE
// word cache, which guards itself.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe_model.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/post_processor.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/tokenizer_config.h"

namespace moetier::text {

struct TokenizerTables {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
  PostProcessor post_processor;
  Decoder decoder;
  TokenizerConfig config;

  std::vector<AddedToken> added_tokens;             // in tokenizer.json order
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in added_tokens
  VocabMap added_by_content;                        // content -> id
  AddedTokenMatcher raw_matcher;                    // added tokens with normalized == false
  AddedTokenMatcher normalized_matcher;             // the others, matched after normalization
  int32_t vocab_size = 0;

  // The vocabulary string of `id` (added tokens first, as Hugging Face looks them up), or
  // nullptr for an id that neither knows.
  const std::string* TokenString(int32_t id) const {
    if (const auto it = added_by_id.find(id); it != added_by_id.end()) {
      return &added_tokens[it->second].content;
    }
    return model.IdToToken(id);
  }
  bool IsSpecial(int32_t id) const {
    const auto it = added_by_id.find(id);
    return it != added_by_id.end() && added_tokens[it->second].special;
  }
};

}  // namespace moetier::text
