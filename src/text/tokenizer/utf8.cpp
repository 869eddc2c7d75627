#include "text/tokenizer/utf8.h"

#include <utf8proc.h>

#include <cstring>

namespace moetier::text {
namespace {

// Length of the well-formed prefix of the sequence at s[pos] (Unicode 15, table 3-7): the full
// sequence length when it is complete, else how many bytes form a valid but unfinished start
// (0 when even the lead byte cannot start a sequence).
size_t WellFormedPrefix(std::string_view s, size_t pos, size_t* full_length) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  *full_length = 1;
  if (b0 < 0x80) return 1;
  unsigned char lo = 0x80, hi = 0xBF;
  size_t need = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  *full_length = need;
  size_t got = 1;
  for (; got < need && pos + got < s.size(); ++got) {
    const auto b = static_cast<unsigned char>(s[pos + got]);
    const unsigned char l = got == 1 ? lo : 0x80;
    const unsigned char h = got == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return got;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path, 8 bytes at a time: most text is mostly ASCII.
    uint64_t block;
    if (pos + 8 <= s.size() &&
        (std::memcpy(&block, s.data() + pos, 8), block & 0x8080808080808080ull) == 0) {
      pos += 8;
      continue;
    }
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t full = 0;
    const size_t got = WellFormedPrefix(s, pos, &full);
    if (got == 0 || got != full) return false;
    pos += got;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t full = 0;
    const size_t got = WellFormedPrefix(s, pos, &full);
    if (got != 0 && got == full) {
      out.append(s.substr(pos, got));
      pos += got;
    } else {
      // A lead byte that cannot start a sequence is one maximal subpart by itself; otherwise the
      // valid start of an unfinished sequence is.
      out.append(kReplacementUtf8);
      pos += got == 0 ? 1 : got;
    }
  }
  return out;
}

char32_t NextCodePoint(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const size_t n = Utf8SequenceLength(b0);
  if (n == 1 || pos + n > s.size()) {
    ++pos;
    return b0 < 0x80 ? b0 : kReplacementChar;
  }
  char32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  pos += n;
  return cp;
}

void AppendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsWhiteSpace(char32_t c) {
  // The White_Space property list is short and has been stable since Unicode 6.3.
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace moetier::text
