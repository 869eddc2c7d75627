// UTF-8 helpers for the Jinja interpreter: code-point iteration, the whitespace set and case
// mappings that @huggingface/jinja (JavaScript) applies, so trims and splits agree with it.
//
// Contract: arbitrary bytes are accepted. A byte that is not part of valid UTF-8 decodes to
// U+DC80 + byte (as Python's surrogateescape does) and encodes back to that same byte, so a
// template or message with broken UTF-8 passes through unchanged instead of failing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moetier::text::jinja::utf8 {

// Decodes the code point at s[*pos] and advances *pos past it.
char32_t Next(std::string_view s, size_t* pos);
void Append(std::string* out, char32_t cp);

std::vector<char32_t> Decode(std::string_view s);
std::string Encode(const std::vector<char32_t>& cps);
size_t Length(std::string_view s);

// JavaScript's \s set (what String.prototype.trim and /\s/ use).
bool IsSpace(char32_t cp);

enum class TrimSide { kLeft, kRight, kBoth };
// Trims JavaScript whitespace.
std::string Trim(std::string_view s, TrimSide side);
// Trims the code points of `chars` (Python's str.strip(chars)).
std::string TrimChars(std::string_view s, std::string_view chars, TrimSide side);

std::string ToUpper(std::string_view s);
std::string ToLower(std::string_view s);
char32_t UpperOf(char32_t cp);

}  // namespace moetier::text::jinja::utf8
