#include "text/tokenizer/byte_level.h"

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

bool StandsForItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

}  // namespace

ByteLevelAlphabet::ByteLevelAlphabet() {
  decode_.fill(-1);
  char32_t next_unused = 256;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = StandsForItself(b) ? static_cast<char32_t>(b) : next_unused++;
    std::string utf8;
    AppendUtf8(cp, utf8);
    length_[b] = static_cast<uint8_t>(utf8.size());
    for (size_t i = 0; i < utf8.size(); ++i) spelled_[b][i] = utf8[i];
    decode_[cp] = static_cast<int16_t>(b);
  }
}

void ByteLevelAlphabet::EncodeAppend(std::string_view raw, std::string& out) const {
  // Sized once for the worst case (2 bytes per byte) and trimmed: appending per byte costs
  // more than the spelling itself.
  const size_t base = out.size();
  out.resize(base + 2 * raw.size());
  char* dst = out.data() + base;
  for (const char ch : raw) {
    const auto b = static_cast<uint8_t>(ch);
    dst[0] = spelled_[b][0];
    dst[1] = spelled_[b][1];
    dst += length_[b];
  }
  out.resize(static_cast<size_t>(dst - out.data()));
}

}  // namespace moetier::text
