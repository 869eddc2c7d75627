// How Hugging Face cuts a string: a pattern (literal or regex) or a character predicate marks
// the text as alternating match / non-match segments, and a SplitBehavior decides which segments
// become pieces (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/regex.h"

namespace moetier::text {

// One segment of a cut: bytes [begin, end) of the text, and whether the pattern matched it.
struct Segment {
  size_t begin = 0;
  size_t end = 0;
  bool is_match = false;
};

// tokenizer.json's {"String": "..."} or {"Regex": "..."}.
class Pattern {
 public:
  static Expected<Pattern> FromJson(const Json& j, std::string_view path);
  static Pattern Literal(std::string text);

  // Appends segments covering all of `text` (an empty text gives one empty non-match).
  void FindSegments(std::string_view text, std::vector<Segment>& out) const;

  // Replaces every match of the pattern in `text` by `content`.
  std::string ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // set for {"Regex": ...}; shared so steps stay copyable
};

// Segments for a character predicate: every matching character is a match of its own, runs of
// other characters one non-match (Rust's `impl Pattern for Fn(char) -> bool`).
void FindCharSegments(std::string_view text, const std::function<bool(char32_t)>& pred,
                      std::vector<Segment>& out);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Expected<SplitBehavior> ParseSplitBehavior(const Json& j, std::string_view path);

// Turns segments into the kept pieces [begin, end) (non-empty only), in order.
void ApplySplitBehavior(const std::vector<Segment>& segments, SplitBehavior behavior,
                        std::vector<std::pair<size_t, size_t>>& pieces);

}  // namespace moetier::text
