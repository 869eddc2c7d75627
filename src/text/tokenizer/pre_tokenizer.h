// tokenizer.json's "pre_tokenizer": cuts normalized text into the words the model encodes one by
// one, and may rewrite them (ByteLevel spells bytes, Metaspace writes '▁').
//
// Supported: Split (regex or literal, any behavior, invert), ByteLevel (add_prefix_space,
// use_regex), Metaspace (replacement, prepend_scheme always/first/never, split), Digits,
// Whitespace, WhitespaceSplit, Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/pattern.h"

namespace moetier::text {

// Words over one buffer: pieces are byte ranges of `text`. `at_origin` marks a piece that starts
// at offset 0 of the caller's input (what Metaspace's prepend_scheme "first" looks at).
struct PieceList {
  struct Piece {
    uint32_t begin = 0;
    uint32_t end = 0;
    bool at_origin = false;
  };
  std::string text;
  std::vector<Piece> pieces;

  std::string_view View(const Piece& p) const {
    return std::string_view(text).substr(p.begin, p.end - p.begin);
  }
};

class PreTokenizer {
 public:
  // `j` is the value of "pre_tokenizer" (null means none: the text is one word).
  static Expected<PreTokenizer> FromJson(const Json& j, std::string_view path);

  // Replaces `words` with the result of every step, in order. Empty pieces are dropped.
  // With defer_byte_spelling, a final ByteLevel step cuts the words but leaves them as raw
  // bytes: the model spells them (ByteLevelAlphabet) only for words it has not cached, which
  // saves rewriting every byte of the text.
  void Apply(PieceList& words, bool defer_byte_spelling = false) const;

  // The alphabet a deferred final ByteLevel step would have spelled words with, or nullptr when
  // the last step is not ByteLevel.
  const ByteLevelAlphabet* final_byte_level() const {
    return !steps_.empty() && steps_.back().kind == Kind::kByteLevel ? alphabet_.get() : nullptr;
  }

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace, kDigits, kWhitespace, kWhitespaceSplit };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    Kind kind = Kind::kSplit;
    std::shared_ptr<const Pattern> pattern;  // Split, ByteLevel with use_regex, Whitespace
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;                 // Split
    bool add_prefix_space = false;       // ByteLevel
    bool flag = false;                   // Digits: individual; Metaspace: split
    std::string replacement;             // Metaspace, as UTF-8
    Prepend prepend = Prepend::kAlways;  // Metaspace
  };
  Status AddFromJson(const Json& j, std::string_view path);
  void ApplySplit(const Step& step, PieceList& words) const;
  void ApplyByteLevel(const Step& step, bool spell, PieceList& words) const;
  void ApplyMetaspace(const Step& step, PieceList& words) const;
  void ApplyCharSplit(const Step& step, PieceList& words) const;

  std::vector<Step> steps_;
  std::shared_ptr<const ByteLevelAlphabet> alphabet_;
};

}  // namespace moetier::text
