// tokenizer.json's "decoder": turns the vocabulary strings of a list of tokens back into text.
// Each step maps a list of strings to a list of strings, and the last list is concatenated.
//
// Supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence. Their quirks are
// kept on purpose, because they are what Hugging Face returns: Metaspace drops every '▁' of the
// first token (not just a leading one); ByteFallback turns an invalid run of <0xNN> tokens into
// one U+FFFD per token; ByteLevel passes a token that is not in its alphabet through as UTF-8.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/pattern.h"

namespace moetier::text {

class Decoder {
 public:
  // `j` is the value of "decoder"; null means none (tokens are joined with spaces).
  static Expected<Decoder> FromJson(const Json& j, std::string_view path);

  std::string Decode(std::vector<std::string> tokens) const;

  // Whether `token` is a <0xNN> token that a ByteFallback step would merge with its neighbours.
  bool MergesByteTokens() const { return has_byte_fallback_; }
  static bool IsByteToken(std::string_view token, unsigned char* byte = nullptr);

 private:
  enum class Kind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace };
  struct Step {
    Kind kind = Kind::kFuse;
    std::string text;     // Metaspace: replacement; Strip: content; Replace: replacement
    bool prepend = true;  // Metaspace: whether the prepend scheme is not "never"
    size_t start = 0;     // Strip
    size_t stop = 0;      // Strip
    std::shared_ptr<const Pattern> pattern;  // Replace
  };
  Status AddFromJson(const Json& j, std::string_view path);

  bool present_ = false;
  bool has_byte_fallback_ = false;
  std::vector<Step> steps_;
  std::shared_ptr<const ByteLevelAlphabet> alphabet_;
};

}  // namespace moetier::text
