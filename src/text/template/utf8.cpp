#include "text/template/utf8.h"

#include <utf8proc.h>

#include <algorithm>

namespace moetier::text::jinja::utf8 {
namespace {

constexpr char32_t kEscapedByteBase = 0xDC80;

char32_t EscapeByte(unsigned char b) {
  return kEscapedByteBase + (b & 0x7F);
}

}  // namespace

char32_t Next(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  }
  int extra = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    extra = 1, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    extra = 2, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    extra = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++*pos;
    return EscapeByte(b0);
  }
  if (*pos + extra >= s.size()) {  // truncated sequence
    ++*pos;
    return EscapeByte(b0);
  }
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<unsigned char>(s[*pos + k]);
    if ((b & 0xC0) != 0x80) {
      ++*pos;
      return EscapeByte(b0);
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8: keep the bytes.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*pos;
    return EscapeByte(b0);
  }
  *pos += extra + 1;
  return cp;
}

void Append(std::string* out, char32_t cp) {
  if (cp >= kEscapedByteBase && cp <= kEscapedByteBase + 0x7F) {
    out->push_back(static_cast<char>(0x80 + (cp - kEscapedByteBase)));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) cps.push_back(Next(s, &i));
  return cps;
}

std::string Encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) Append(&out, cp);
  return out;
}

size_t Length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) Next(s, &i);
  return n;
}

bool IsSpace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

template <typename Pred>
std::string TrimIf(std::string_view s, TrimSide side, Pred drop) {
  std::vector<char32_t> cps = Decode(s);
  size_t begin = 0;
  size_t end = cps.size();
  if (side != TrimSide::kRight) {
    while (begin < end && drop(cps[begin])) ++begin;
  }
  if (side != TrimSide::kLeft) {
    while (end > begin && drop(cps[end - 1])) --end;
  }
  std::string out;
  for (size_t i = begin; i < end; ++i) Append(&out, cps[i]);
  return out;
}

}  // namespace

std::string Trim(std::string_view s, TrimSide side) {
  return TrimIf(s, side, IsSpace);
}

std::string TrimChars(std::string_view s, std::string_view chars, TrimSide side) {
  const std::vector<char32_t> set = Decode(chars);
  return TrimIf(s, side,
                [&](char32_t cp) { return std::find(set.begin(), set.end(), cp) != set.end(); });
}

namespace {

char32_t MapCase(char32_t cp, bool upper) {
  if (cp < 0x80) {
    if (upper && cp >= 'a' && cp <= 'z') return cp - 32;
    if (!upper && cp >= 'A' && cp <= 'Z') return cp + 32;
    return cp;
  }
  if (cp >= kEscapedByteBase && cp <= kEscapedByteBase + 0x7F) return cp;
  const auto mapped = upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))
                            : utf8proc_tolower(static_cast<utf8proc_int32_t>(cp));
  return static_cast<char32_t>(mapped);
}

std::string MapString(std::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) Append(&out, MapCase(Next(s, &i), upper));
  return out;
}

}  // namespace

char32_t UpperOf(char32_t cp) {
  return MapCase(cp, true);
}
std::string ToUpper(std::string_view s) {
  return MapString(s, true);
}
std::string ToLower(std::string_view s) {
  return MapString(s, false);
}

}  // namespace moetier::text::jinja::utf8
