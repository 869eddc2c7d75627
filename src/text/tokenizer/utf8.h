// UTF-8 and Unicode helpers for the tokenizer: validation, lossy repair, code point access and
// the character classes Hugging Face's Rust code uses (char::is_whitespace, char::is_numeric).
//
// Contract: every function that takes text assumes valid UTF-8 unless its name says otherwise;
// Tokenizer::Encode repairs its input with SanitizeUtf8 first, so nothing below it sees bad bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moetier::text {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Replaces each maximal ill-formed subsequence by U+FFFD, the policy of Rust's
// String::from_utf8_lossy and of the WHATWG TextDecoder, so our text equals what a Rust or JS
// caller would have handed to Hugging Face after a lossy conversion.
std::string SanitizeUtf8(std::string_view s);

// Byte length of the (valid) sequence that starts with `lead`; 1 for anything else.
inline size_t Utf8SequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[pos] of valid UTF-8 and advances pos past it.
char32_t NextCodePoint(std::string_view s, size_t& pos);

void AppendUtf8(char32_t cp, std::string& out);

// Unicode White_Space (Rust's char::is_whitespace and regex \s).
bool IsWhiteSpace(char32_t c);
// General category Nd, Nl or No (Rust's char::is_numeric).
bool IsNumeric(char32_t c);
// Letters, marks, decimal digits, connector punctuation and joiners: Rust regex's Unicode \w,
// approximated from general categories (Other_Alphabetic symbols such as circled letters differ).
bool IsWordChar(char32_t c);

}  // namespace moetier::text
