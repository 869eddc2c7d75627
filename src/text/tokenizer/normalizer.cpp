#include "text/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

bool IsAscii(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

std::string UnicodeNormalize(std::string_view s, utf8proc_option_t options) {
  // Every normal form leaves ASCII as it is; most prompts are mostly ASCII.
  if (IsAscii(s)) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out, options);
  if (n < 0) {
    // Only reachable with invalid UTF-8, which Encode repairs before normalizing.
    std::free(out);
    return std::string(s);
  }
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

bool IsCased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

bool IsCaseIgnorable(char32_t c) {
  if (c == '\'' || c == '.' || c == ':' || c == 0xB7 || c == 0x2019) return true;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME ||
         cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK;
}

std::string Lowercase(std::string_view s) {
  std::u32string cps;
  for (size_t pos = 0; pos < s.size();) cps.push_back(NextCodePoint(s, pos));
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c));
    } else if (c == 0x130) {  // İ lowercases to i + combining dot above
      AppendUtf8('i', out);
      AppendUtf8(0x307, out);
    } else if (c == 0x3A3) {  // Σ: final form at the end of a word
      size_t j = i;
      bool cased_before = false;
      while (j > 0) {
        --j;
        if (IsCaseIgnorable(cps[j])) continue;
        cased_before = IsCased(cps[j]);
        break;
      }
      bool cased_after = false;
      for (size_t k = i + 1; k < cps.size(); ++k) {
        if (IsCaseIgnorable(cps[k])) continue;
        cased_after = IsCased(cps[k]);
        break;
      }
      AppendUtf8(cased_before && !cased_after ? 0x3C2 : 0x3C3, out);
    } else {
      AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))), out);
    }
  }
  return out;
}

std::string Strip(std::string_view s, bool left, bool right) {
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!IsWhiteSpace(NextCodePoint(s, next))) break;
      begin = next;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t next = start;
      if (!IsWhiteSpace(NextCodePoint(s, next))) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

}  // namespace

Expected<Normalizer> Normalizer::FromJson(const Json& j, std::string_view path) {
  Normalizer n;
  if (j.is_null()) return n;
  MT_RETURN_IF_ERROR(n.AddFromJson(j, path));
  return n;
}

Status Normalizer::AddFromJson(const Json& j, std::string_view path) {
  if (!j.is_object()) return FieldError(path, "expected an object");
  // Bound by reference: GCC 12 misreports a string moved out of the Expected as uninitialized.
  const auto type_or = RequiredString(j, "type", path);
  if (!type_or.ok()) return type_or.status();
  const std::string& type = type_or.value();
  if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return FieldError(JoinPath(path, "normalizers"), "expected an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      MT_RETURN_IF_ERROR(
          AddFromJson((*it)[i], JoinPath(path, "normalizers[" + std::to_string(i) + "]")));
    }
    return OkStatus();
  }
  Step step{Kind::kNfc, {}, nullptr};
  if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    MT_ASSIGN_OR_RETURN(step.text, RequiredString(j, "prepend", path));
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const auto it = j.find("pattern");
    if (it == j.end()) return FieldError(JoinPath(path, "pattern"), "missing");
    MT_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*it, JoinPath(path, "pattern")));
    step.pattern = std::make_shared<const Pattern>(std::move(pattern));
    MT_ASSIGN_OR_RETURN(step.text, RequiredString(j, "content", path));
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    MT_ASSIGN_OR_RETURN(step.strip_left, OptionalBool(j, "strip_left", path, true));
    MT_ASSIGN_OR_RETURN(step.strip_right, OptionalBool(j, "strip_right", path, true));
  } else {
    return FieldError(JoinPath(path, "type"),
                      "unsupported normalizer \"" + type +
                          "\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, "
                          "Strip, Sequence)");
  }
  steps_.push_back(std::move(step));
  return OkStatus();
}

std::string Normalizer::Apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kNfc:
        s = UnicodeNormalize(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        break;
      case Kind::kNfd:
        s = UnicodeNormalize(s,
                             static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
        break;
      case Kind::kNfkc:
        s = UnicodeNormalize(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE |
                                                               UTF8PROC_COMPAT));
        break;
      case Kind::kNfkd:
        s = UnicodeNormalize(s, static_cast<utf8proc_option_t>(
                                    UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
        break;
      case Kind::kLowercase:
        s = Lowercase(s);
        break;
      case Kind::kPrepend:
        if (!s.empty()) s = step.text + s;
        break;
      case Kind::kReplace:
        s = step.pattern->ReplaceAll(s, step.text);
        break;
      case Kind::kStrip:
        s = Strip(s, step.strip_left, step.strip_right);
        break;
    }
  }
  return s;
}

}  // namespace moetier::text
