// GPT-2's byte-level alphabet: each of the 256 byte values is written as one printable Unicode
// character (printable Latin-1 bytes stand for themselves, the rest map to U+0100 and up, in byte
// order), so that a BPE vocabulary of strings can spell arbitrary bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace moetier::text {

class ByteLevelAlphabet {
 public:
  // The table is a pure function of the byte values; building it costs a few microseconds.
  ByteLevelAlphabet();

  // The UTF-8 spelling (2 bytes at most) of byte `b`.
  std::string_view Encode(uint8_t b) const { return {spelled_[b].data(), length_[b]}; }
  // Appends the spelling of every byte of `raw` to `out`.
  void EncodeAppend(std::string_view raw, std::string& out) const;
  // The byte that code point `c` spells, or -1 when `c` is not in the alphabet.
  int Decode(char32_t c) const { return c < decode_.size() ? decode_[c] : -1; }

 private:
  std::array<std::array<char, 2>, 256> spelled_{};
  std::array<uint8_t, 256> length_{};
  std::array<int16_t, 324> decode_{};  // code points used by the alphabet all lie below 324
};

}  // namespace moetier::text
