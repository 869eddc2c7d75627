// Fuzz target for the tokenizer.json loader: any bytes must give a Tokenizer or a Status, never
// a crash, a hang or a sanitizer report; a tokenizer that loads must then encode, decode and
// stream-decode without one either.
//
// Input: the tokenizer.json text, optionally followed by a NUL byte and a tokenizer_config.json
// text. Seeds: fuzz/corpus/tokenizer_json/ (small valid files of each pipeline kind, and broken
// ones).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view tokenizer_json = input.substr(0, nul);
  const std::string_view config_json =
      nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  auto tokenizer =
      moetier::text::Tokenizer::FromJson(tokenizer_json, config_json, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  const std::string texts[] = {"Hello, world! 123 <s></s>", " \t\n  x\xE2\x96\x81y  ",
                               "\xF0\x9F\x8C\x8D \xC3\xA9 \xFF\xC3",
                               std::string(input.substr(0, 200))};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tokenizer->Encode(text, /*add_special_tokens=*/true);
    (void)tokenizer->Decode(ids, /*skip_special_tokens=*/false);
    (void)tokenizer->Decode(ids, /*skip_special_tokens=*/true);
    moetier::text::StreamDecoder stream(*tokenizer, false);
    for (const int32_t id : ids) (void)stream.Push(id);
    (void)stream.Flush();
  }
  const std::vector<int32_t> odd_ids = {-1, 0, 1, 2, 3, tokenizer->vocab_size(), 1 << 30};
  (void)tokenizer->Decode(odd_ids, false);
  return 0;
}
