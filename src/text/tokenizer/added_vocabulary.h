// Added tokens (tokenizer.json "added_tokens"): strings matched in the text before the model
// runs and never split. As in Hugging Face, tokens with normalized=false are matched in the raw
// text, the others in the normalized text, leftmost first and then longest; single_word, lstrip
// and rstrip adjust or reject a match the same way.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moetier::text {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// Matches one set of added tokens (either the raw-text set or the normalized-text set).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() { first_byte_.fill(false); }
  // `patterns[i]` is what to look for (the content, or its normalized form) for `tokens[i]`.
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  bool empty() const { return tokens_.empty(); }

  // Cuts `text` into stretches: on_text(begin, end) for text between tokens (never empty) and
  // on_token(id) for each added token found, in order.
  void Split(std::string_view text, const std::function<void(size_t, size_t)>& on_text,
             const std::function<void(int32_t)>& on_token) const;

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  // by_first_byte_[b]: indices of non-empty patterns starting with byte b, longest first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace moetier::text
