#include "text/tokenizer/pattern.h"

#include <utility>

#include "text/tokenizer/utf8.h"

namespace moetier::text {

Expected<Pattern> Pattern::FromJson(const Json& j, std::string_view path) {
  Pattern p;
  if (!j.is_object()) return FieldError(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  if (const auto it = j.find("String"); it != j.end()) {
    if (!it->is_string()) return FieldError(JoinPath(path, "String"), "expected a string");
    p.literal_ = it->get<std::string>();
    return p;
  }
  if (const auto it = j.find("Regex"); it != j.end()) {
    if (!it->is_string()) return FieldError(JoinPath(path, "Regex"), "expected a string");
    auto compiled = Regex::Compile(it->get<std::string>());
    if (!compiled.ok()) return FieldError(JoinPath(path, "Regex"), compiled.message());
    p.regex_ = std::make_shared<const Regex>(std::move(compiled).value());
    return p;
  }
  return FieldError(path, "expected {\"String\": ...} or {\"Regex\": ...}");
}

Pattern Pattern::Literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

void Pattern::FindSegments(std::string_view text, std::vector<Segment>& out) const {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  auto add_match = [&](size_t begin, size_t end) {
    if (prev != begin) out.push_back({prev, begin, false});
    out.push_back({begin, end, true});
    prev = end;
  };
  if (regex_) {
    std::vector<std::pair<size_t, size_t>> matches;
    regex_->FindAll(text, matches);
    for (const auto& [begin, end] : matches) add_match(begin, end);
  } else if (!literal_.empty()) {
    for (size_t at = text.find(literal_); at != std::string_view::npos;
         at = text.find(literal_, at + literal_.size())) {
      add_match(at, at + literal_.size());
    }
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
}

std::string Pattern::ReplaceAll(std::string_view text, std::string_view content) const {
  std::vector<Segment> segments;
  FindSegments(text, segments);
  std::string out;
  out.reserve(text.size());
  for (const Segment& s : segments) {
    if (s.is_match) {
      out.append(content);
    } else {
      out.append(text.substr(s.begin, s.end - s.begin));
    }
  }
  return out;
}

void FindCharSegments(std::string_view text, const std::function<bool(char32_t)>& pred,
                      std::vector<Segment>& out) {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t run_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t at = pos;
    const char32_t c = NextCodePoint(text, pos);
    if (pred(c)) {
      if (run_start < at) out.push_back({run_start, at, false});
      out.push_back({at, pos, true});
      run_start = pos;
    }
  }
  if (run_start < text.size()) out.push_back({run_start, text.size(), false});
}

Expected<SplitBehavior> ParseSplitBehavior(const Json& j, std::string_view path) {
  if (!j.is_string()) return FieldError(path, "expected a split behavior name");
  const std::string name = j.get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return FieldError(path, "unknown split behavior \"" + name +
                              "\" (known: Removed, Isolated, MergedWithPrevious, "
                              "MergedWithNext, Contiguous)");
}

void ApplySplitBehavior(const std::vector<Segment>& segments, SplitBehavior behavior,
                        std::vector<std::pair<size_t, size_t>>& pieces) {
  // (begin, end, drop) before empty pieces are filtered, as Hugging Face folds them.
  struct Cut {
    size_t begin, end;
    bool drop;
  };
  std::vector<Cut> cuts;
  cuts.reserve(segments.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) cuts.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) cuts.push_back({s.begin, s.end, s.is_match});
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !cuts.empty()) {
          cuts.back().end = s.end;
        } else {
          cuts.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !cuts.empty()) {
          cuts.back().end = s.end;
        } else {
          cuts.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Folded from the right: a match glues onto the piece that follows it.
      bool previous_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !cuts.empty()) {
          cuts.back().begin = it->begin;
        } else {
          cuts.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::vector<Cut> reversed(cuts.rbegin(), cuts.rend());
      cuts = std::move(reversed);
      break;
    }
  }
  for (const Cut& c : cuts) {
    if (!c.drop && c.end > c.begin) pieces.emplace_back(c.begin, c.end);
  }
}

}  // namespace moetier::text
