#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <utility>

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

// The code point that ends at byte `end` of valid UTF-8 `s` (end > 0).
char32_t CodePointBefore(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(s, start);
}

// Start of the run of White_Space that ends `s` (s.size() when there is none).
size_t TrailingSpaceStart(std::string_view s) {
  size_t at = s.size();
  while (at > 0) {
    size_t start = at - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t next = start;
    if (!IsWhiteSpace(NextCodePoint(s, next))) break;
    at = start;
  }
  return at;
}

// Length of the run of White_Space that starts `s`.
size_t LeadingSpaceLength(std::string_view s) {
  size_t at = 0;
  while (at < s.size()) {
    size_t next = at;
    if (!IsWhiteSpace(NextCodePoint(s, next))) break;
    at = next;
  }
  return at;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)) {
  first_byte_.fill(false);
  for (uint32_t i = 0; i < patterns_.size(); ++i) {
    if (patterns_[i].empty()) continue;  // an empty token can never be matched
    const auto b = static_cast<uint8_t>(patterns_[i][0]);
    by_first_byte_[b].push_back(i);
    first_byte_[b] = true;
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [this](uint32_t a, uint32_t b) {
      return patterns_[a].size() > patterns_[b].size();
    });
  }
}

void AddedTokenMatcher::Split(std::string_view text,
                              const std::function<void(size_t, size_t)>& on_text,
                              const std::function<void(int32_t)>& on_token) const {
  size_t emitted = 0;  // text before this offset has been handed out
  size_t pos = 0;
  while (pos < text.size()) {
    const auto b = static_cast<uint8_t>(text[pos]);
    if (!first_byte_[b]) {
      ++pos;
      continue;
    }
    // Leftmost-longest: at the first offset where any token starts, the longest one wins.
    const uint32_t* found = nullptr;
    for (const uint32_t& i : by_first_byte_[b]) {
      if (text.substr(pos).starts_with(patterns_[i])) {
        found = &i;
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[*found];
    size_t start = pos;
    size_t stop = pos + patterns_[*found].size();
    // A rejected match is skipped whole: the scan resumes after it, as the automaton does.
    pos = stop;
    if (token.single_word) {
      const bool word_before = start > 0 && IsWordChar(CodePointBefore(text, start));
      size_t after = stop;
      const bool word_after = stop < text.size() && IsWordChar(NextCodePoint(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), emitted);
    if (token.rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (emitted < start) on_text(emitted, start);
    on_token(token.id);
    emitted = std::max(emitted, stop);
    pos = std::max(pos, stop);
  }
  if (emitted < text.size()) on_text(emitted, text.size());
}

}  // namespace moetier::text
