#include "text/tokenizer/decoder.h"

#include <utility>

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::vector<std::string> DecodeByteLevel(const ByteLevelAlphabet& alphabet,
                                         std::vector<std::string> tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    const size_t mark = bytes.size();
    bool all_in_alphabet = true;
    for (size_t pos = 0; pos < token.size();) {
      const int b = alphabet.Decode(NextCodePoint(token, pos));
      if (b < 0) {
        all_in_alphabet = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
    if (!all_in_alphabet) {
      bytes.resize(mark);
      bytes.append(token);
    }
  }
  std::vector<std::string> out;
  out.push_back(IsValidUtf8(bytes) ? std::move(bytes) : SanitizeUtf8(bytes));
  return out;
}

std::vector<std::string> DecodeByteFallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (IsValidUtf8(run)) {
      out.push_back(run);
    } else {
      for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(kReplacementUtf8);
    }
    run.clear();
    run_tokens = 0;
  };
  for (std::string& token : tokens) {
    unsigned char byte = 0;
    if (Decoder::IsByteToken(token, &byte)) {
      run.push_back(static_cast<char>(byte));
      ++run_tokens;
    } else {
      flush();
      out.push_back(std::move(token));
    }
  }
  flush();
  return out;
}

void DecodeMetaspace(std::vector<std::string>& tokens, std::string_view replacement, bool prepend) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string& token = tokens[i];
    if (token.find(replacement) == std::string::npos) continue;
    std::string rewritten;
    rewritten.reserve(token.size());
    for (size_t pos = 0; pos < token.size();) {
      if (std::string_view(token).substr(pos).starts_with(replacement)) {
        if (!(i == 0 && prepend)) rewritten.push_back(' ');
        pos += replacement.size();
      } else {
        rewritten.push_back(token[pos++]);
      }
    }
    token = std::move(rewritten);
  }
}

void DecodeStrip(std::vector<std::string>& tokens, std::string_view content, size_t start,
                 size_t stop) {
  for (std::string& token : tokens) {
    size_t begin = 0;
    for (size_t n = 0; n < start && std::string_view(token).substr(begin).starts_with(content);
         ++n) {
      begin += content.size();
    }
    size_t end = token.size();
    for (size_t n = 0; n < stop && end >= begin + content.size() &&
                       std::string_view(token).substr(0, end).ends_with(content);
         ++n) {
      end -= content.size();
    }
    token = token.substr(begin, end - begin);
  }
}

}  // namespace

bool Decoder::IsByteToken(std::string_view token, unsigned char* byte) {
  // Exactly "<0x" + two hex digits + ">".
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return false;
  const int hi = HexDigit(token[3]);
  const int lo = HexDigit(token[4]);
  if (hi < 0 || lo < 0) return false;
  if (byte != nullptr) *byte = static_cast<unsigned char>(hi * 16 + lo);
  return true;
}

Expected<Decoder> Decoder::FromJson(const Json& j, std::string_view path) {
  Decoder d;
  if (j.is_null()) return d;
  d.present_ = true;
  MT_RETURN_IF_ERROR(d.AddFromJson(j, path));
  return d;
}

Status Decoder::AddFromJson(const Json& j, std::string_view path) {
  if (!j.is_object()) return FieldError(path, "expected an object");
  // Bound by reference: GCC 12 misreports a string moved out of the Expected as uninitialized.
  const auto type_or = RequiredString(j, "type", path);
  if (!type_or.ok()) return type_or.status();
  const std::string& type = type_or.value();
  Step step;
  if (type == "Sequence") {
    const auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return FieldError(JoinPath(path, "decoders"), "expected an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      MT_RETURN_IF_ERROR(
          AddFromJson((*it)[i], JoinPath(path, "decoders[" + std::to_string(i) + "]")));
    }
    return OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    if (!alphabet_) alphabet_ = std::make_shared<const ByteLevelAlphabet>();
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    MT_ASSIGN_OR_RETURN(step.text, RequiredString(j, "replacement", path));
    if (step.text.empty()) return FieldError(JoinPath(path, "replacement"), "is empty");
    MT_ASSIGN_OR_RETURN(const auto scheme, OptionalString(j, "prepend_scheme", path));
    MT_ASSIGN_OR_RETURN(const bool prefix, OptionalBool(j, "add_prefix_space", path, true));
    step.prepend = scheme ? *scheme != "never" : prefix;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
    has_byte_fallback_ = true;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    MT_ASSIGN_OR_RETURN(step.text, RequiredString(j, "content", path));
    size_t pos = 0;
    if (step.text.empty() || (NextCodePoint(step.text, pos), pos) != step.text.size()) {
      return FieldError(JoinPath(path, "content"), "expected exactly one character");
    }
    MT_ASSIGN_OR_RETURN(const int64_t start, OptionalCount(j, "start", path, 0));
    MT_ASSIGN_OR_RETURN(const int64_t stop, OptionalCount(j, "stop", path, 0));
    step.start = static_cast<size_t>(start);
    step.stop = static_cast<size_t>(stop);
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const auto it = j.find("pattern");
    if (it == j.end()) return FieldError(JoinPath(path, "pattern"), "missing");
    MT_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*it, JoinPath(path, "pattern")));
    step.pattern = std::make_shared<const Pattern>(std::move(pattern));
    MT_ASSIGN_OR_RETURN(step.text, RequiredString(j, "content", path));
  } else {
    return FieldError(JoinPath(path, "type"),
                      "unsupported decoder \"" + type +
                          "\" (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, "
                          "Replace, Sequence)");
  }
  steps_.push_back(std::move(step));
  return OkStatus();
}

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined.push_back(' ');
      joined += tokens[i];
    }
    return joined;
  }
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel:
        tokens = DecodeByteLevel(*alphabet_, std::move(tokens));
        break;
      case Kind::kMetaspace:
        DecodeMetaspace(tokens, step.text, step.prepend);
        break;
      case Kind::kByteFallback:
        tokens = DecodeByteFallback(std::move(tokens));
        break;
      case Kind::kFuse: {
        std::string fused;
        for (const std::string& t : tokens) fused += t;
        tokens.assign(1, std::move(fused));
        break;
      }
      case Kind::kStrip:
        DecodeStrip(tokens, step.text, step.start, step.stop);
        break;
      case Kind::kReplace:
        for (std::string& t : tokens) t = step.pattern->ReplaceAll(t, step.text);
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace moetier::text
