// tokenizer.json's "normalizer": a Sequence of text-to-text steps run on every stretch of input
// between added tokens, before pre-tokenization.
//
// Supported: NFC, NFD, NFKC, NFKD (utf8proc; its Unicode version may trail Rust's
// unicode-normalization by a release), Lowercase, Prepend, Replace, Strip, Sequence. Lowercase
// uses full case mapping for U+0130 and final sigma, and utf8proc's simple mapping otherwise.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/pattern.h"

namespace moetier::text {

class Normalizer {
 public:
  // `j` is the value of "normalizer" (null means none). Nested Sequences are flattened, which
  // runs the same steps in the same order.
  static Expected<Normalizer> FromJson(const Json& j, std::string_view path);

  bool empty() const { return steps_.empty(); }
  std::string Apply(std::string_view text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string text;                        // Prepend: what to prepend; Replace: the replacement
    std::shared_ptr<const Pattern> pattern;  // Replace
    bool strip_left = false;
    bool strip_right = false;
  };
  Status AddFromJson(const Json& j, std::string_view path);

  std::vector<Step> steps_;
};

}  // namespace moetier::text
