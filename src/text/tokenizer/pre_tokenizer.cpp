#include "text/tokenizer/pre_tokenizer.h"

#include <utility>

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

// GPT-2's word pattern, which ByteLevel applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Whitespace pre-tokenizer keeps runs of word characters and runs of other non-blanks.
constexpr std::string_view kWhitespacePattern = R"(\w+|[^\w\s]+)";

Expected<std::shared_ptr<const Pattern>> CompileBuiltin(std::string_view pattern) {
  MT_ASSIGN_OR_RETURN(Pattern p, Pattern::FromJson(Json{{"Regex", std::string(pattern)}}, ""));
  return std::make_shared<const Pattern>(std::move(p));
}

}  // namespace

Expected<PreTokenizer> PreTokenizer::FromJson(const Json& j, std::string_view path) {
  PreTokenizer p;
  if (j.is_null()) return p;
  MT_RETURN_IF_ERROR(p.AddFromJson(j, path));
  return p;
}

Status PreTokenizer::AddFromJson(const Json& j, std::string_view path) {
  if (!j.is_object()) return FieldError(path, "expected an object");
  // Bound by reference: GCC 12 misreports a string moved out of the Expected as uninitialized.
  const auto type_or = RequiredString(j, "type", path);
  if (!type_or.ok()) return type_or.status();
  const std::string& type = type_or.value();
  Step step;
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return FieldError(JoinPath(path, "pretokenizers"), "expected an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      MT_RETURN_IF_ERROR(
          AddFromJson((*it)[i], JoinPath(path, "pretokenizers[" + std::to_string(i) + "]")));
    }
    return OkStatus();
  } else if (type == "Split") {
    step.kind = Kind::kSplit;
    const auto it = j.find("pattern");
    if (it == j.end()) return FieldError(JoinPath(path, "pattern"), "missing");
    MT_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*it, JoinPath(path, "pattern")));
    step.pattern = std::make_shared<const Pattern>(std::move(pattern));
    const auto behavior = j.find("behavior");
    if (behavior == j.end()) return FieldError(JoinPath(path, "behavior"), "missing");
    const std::string behavior_path = JoinPath(path, "behavior");
    MT_ASSIGN_OR_RETURN(step.behavior, ParseSplitBehavior(*behavior, behavior_path));
    MT_ASSIGN_OR_RETURN(step.invert, OptionalBool(j, "invert", path, false));
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    MT_ASSIGN_OR_RETURN(step.add_prefix_space, OptionalBool(j, "add_prefix_space", path, true));
    MT_ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(j, "use_regex", path, true));
    if (use_regex) {
      MT_ASSIGN_OR_RETURN(step.pattern, CompileBuiltin(kGpt2Pattern));
    }
    if (!alphabet_) alphabet_ = std::make_shared<const ByteLevelAlphabet>();
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    MT_ASSIGN_OR_RETURN(step.replacement, RequiredString(j, "replacement", path));
    size_t pos = 0;
    if (step.replacement.empty() ||
        (NextCodePoint(step.replacement, pos), pos) != step.replacement.size()) {
      return FieldError(JoinPath(path, "replacement"), "expected exactly one character");
    }
    MT_ASSIGN_OR_RETURN(const auto scheme, OptionalString(j, "prepend_scheme", path));
    MT_ASSIGN_OR_RETURN(const bool prefix, OptionalBool(j, "add_prefix_space", path, true));
    if (!scheme) {
      step.prepend = prefix ? Prepend::kAlways : Prepend::kNever;
    } else if (*scheme == "always") {
      step.prepend = Prepend::kAlways;
    } else if (*scheme == "first") {
      step.prepend = Prepend::kFirst;
    } else if (*scheme == "never") {
      step.prepend = Prepend::kNever;
    } else {
      return FieldError(JoinPath(path, "prepend_scheme"),
                        "unknown scheme \"" + *scheme + "\" (known: always, first, never)");
    }
    MT_ASSIGN_OR_RETURN(step.flag, OptionalBool(j, "split", path, true));
  } else if (type == "Digits") {
    step.kind = Kind::kDigits;
    MT_ASSIGN_OR_RETURN(step.flag, OptionalBool(j, "individual_digits", path, false));
  } else if (type == "Whitespace") {
    step.kind = Kind::kSplit;
    MT_ASSIGN_OR_RETURN(step.pattern, CompileBuiltin(kWhitespacePattern));
    step.behavior = SplitBehavior::kRemoved;
    step.invert = true;
  } else if (type == "WhitespaceSplit") {
    step.kind = Kind::kWhitespaceSplit;
  } else {
    return FieldError(JoinPath(path, "type"),
                      "unsupported pre-tokenizer \"" + type +
                          "\" (supported: Split, ByteLevel, Metaspace, Digits, Whitespace, "
                          "WhitespaceSplit, Sequence)");
  }
  steps_.push_back(std::move(step));
  return OkStatus();
}

void PreTokenizer::Apply(PieceList& words, bool defer_byte_spelling) const {
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    switch (step.kind) {
      case Kind::kSplit:
        ApplySplit(step, words);
        break;
      case Kind::kByteLevel:
        ApplyByteLevel(step, !(defer_byte_spelling && i + 1 == steps_.size()), words);
        break;
      case Kind::kMetaspace:
        ApplyMetaspace(step, words);
        break;
      case Kind::kDigits:
      case Kind::kWhitespace:
      case Kind::kWhitespaceSplit:
        ApplyCharSplit(step, words);
        break;
    }
  }
  // A step may leave empty pieces only when it had no work to do; drop them for the model.
  std::erase_if(words.pieces, [](const PieceList::Piece& p) { return p.end <= p.begin; });
}

void PreTokenizer::ApplySplit(const Step& step, PieceList& words) const {
  std::vector<PieceList::Piece> out;
  out.reserve(words.pieces.size() * 4);
  std::vector<Segment> segments;
  std::vector<std::pair<size_t, size_t>> kept;
  for (const PieceList::Piece& piece : words.pieces) {
    segments.clear();
    kept.clear();
    step.pattern->FindSegments(words.View(piece), segments);
    if (step.invert) {
      for (Segment& s : segments) s.is_match = !s.is_match;
    }
    ApplySplitBehavior(segments, step.behavior, kept);
    for (const auto& [b, e] : kept) {
      out.push_back({piece.begin + static_cast<uint32_t>(b), piece.begin + static_cast<uint32_t>(e),
                     piece.at_origin && b == 0});
    }
  }
  words.pieces = std::move(out);
}

void PreTokenizer::ApplyCharSplit(const Step& step, PieceList& words) const {
  std::vector<PieceList::Piece> out;
  std::vector<Segment> segments;
  std::vector<std::pair<size_t, size_t>> kept;
  const bool digits = step.kind == Kind::kDigits;
  const SplitBehavior behavior = !digits     ? SplitBehavior::kRemoved
                                 : step.flag ? SplitBehavior::kIsolated
                                             : SplitBehavior::kContiguous;
  for (const PieceList::Piece& piece : words.pieces) {
    segments.clear();
    kept.clear();
    if (digits) {
      FindCharSegments(words.View(piece), IsNumeric, segments);
    } else {
      FindCharSegments(words.View(piece), IsWhiteSpace, segments);
    }
    ApplySplitBehavior(segments, behavior, kept);
    for (const auto& [b, e] : kept) {
      out.push_back({piece.begin + static_cast<uint32_t>(b), piece.begin + static_cast<uint32_t>(e),
                     piece.at_origin && b == 0});
    }
  }
  words.pieces = std::move(out);
}

void PreTokenizer::ApplyByteLevel(const Step& step, bool spell, PieceList& words) const {
  // Deferred spelling with nothing to prepend or cut: the words are already what the model
  // wants (Qwen's and Llama-3's pipelines, where a Split did the cutting).
  if (!spell && !step.add_prefix_space && !step.pattern) return;
  PieceList out;
  out.text.reserve(words.text.size() * 2);
  out.pieces.reserve(words.pieces.size() * 2);
  std::string prefixed;
  std::vector<Segment> segments;
  std::vector<std::pair<size_t, size_t>> kept;
  for (const PieceList::Piece& piece : words.pieces) {
    std::string_view src = words.View(piece);
    if (step.add_prefix_space && (src.empty() || src.front() != ' ')) {
      prefixed.clear();
      prefixed.push_back(' ');
      prefixed.append(src.data(), src.size());
      src = prefixed;
    }
    kept.clear();
    if (step.pattern) {
      segments.clear();
      step.pattern->FindSegments(src, segments);
      ApplySplitBehavior(segments, SplitBehavior::kIsolated, kept);
    } else if (!src.empty()) {
      kept.emplace_back(0, src.size());
    }
    for (const auto& [b, e] : kept) {
      const auto begin = static_cast<uint32_t>(out.text.size());
      if (spell) {
        alphabet_->EncodeAppend(src.substr(b, e - b), out.text);
      } else {
        out.text.append(src.data() + b, e - b);
      }
      out.pieces.push_back(
          {begin, static_cast<uint32_t>(out.text.size()), piece.at_origin && b == 0});
    }
  }
  words = std::move(out);
}

void PreTokenizer::ApplyMetaspace(const Step& step, PieceList& words) const {
  PieceList out;
  out.text.reserve(words.text.size() * 2);
  std::string rewritten;
  std::vector<Segment> segments;
  std::vector<std::pair<size_t, size_t>> kept;
  size_t pos = 0;
  const char32_t replacement_cp = NextCodePoint(step.replacement, pos);
  for (const PieceList::Piece& piece : words.pieces) {
    const std::string_view src = words.View(piece);
    rewritten.clear();
    for (const char c : src) {
      if (c == ' ') {
        rewritten.append(step.replacement);
      } else {
        rewritten.push_back(c);
      }
    }
    const bool starts_with_replacement = rewritten.starts_with(step.replacement);
    const bool prepend =
        !starts_with_replacement &&
        (step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && piece.at_origin));
    if (prepend) rewritten.insert(0, step.replacement);
    kept.clear();
    if (step.flag) {
      segments.clear();
      FindCharSegments(
          rewritten, [replacement_cp](char32_t c) { return c == replacement_cp; }, segments);
      ApplySplitBehavior(segments, SplitBehavior::kMergedWithNext, kept);
    } else if (!rewritten.empty()) {
      kept.emplace_back(0, rewritten.size());
    }
    const auto base = static_cast<uint32_t>(out.text.size());
    out.text.append(rewritten);
    for (const auto& [b, e] : kept) {
      out.pieces.push_back({base + static_cast<uint32_t>(b), base + static_cast<uint32_t>(e),
                            piece.at_origin && b == 0});
    }
  }
  words = std::move(out);
}

}  // namespace moetier::text
