// The corpus test: every line of tests/fixtures/text/tokenizer/corpus.txt (2,400+ lines of prose,
// code, whitespace, many scripts, emoji, combining marks, numbers, URLs and special-token
// strings) must encode to exactly the ids @lenml/tokenizers (an independent JS port of Hugging
// Face's tokenizers) gives, decode back, and stream-decode to the same text. The expected files
// are made by tests/tools/make_expected_tokens.mjs, which documents how each side is fed.
#include <gtest/gtest.h>
#include <utf8proc.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <sstream>

#include "text/tokenizer/test_tokenizers.h"
#include "text/tokenizer/utf8.h"

namespace moetier::text::testing {
namespace {

std::filesystem::path CorpusDir() {
  return FixturesDir() / "text/tokenizer";
}

const std::vector<std::string>& CorpusLines() {
  static const auto lines = SplitLines(ReadFileOrDie(CorpusDir() / "corpus.txt"));
  return lines;
}

std::string Nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string r = n < 0 ? s : std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

// Encodes every input and compares with the expected ids line by line; reports how many lines
// differ and, for the first few, the line and both id lists.
void ExpectSameIds(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                   const std::filesystem::path& expected_file) {
  const std::vector<std::string> expected = SplitLines(ReadFileOrDie(expected_file));
  ASSERT_EQ(inputs.size(), expected.size()) << expected_file;
  size_t mismatches = 0;
  std::ostringstream report;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer.Encode(inputs[i], /*add_special_tokens=*/false);
    const std::vector<int32_t> want = ParseIds(expected[i]);
    if (ids == want) continue;
    if (++mismatches <= 5) {
      report << "\nline " << i + 1 << ": " << nlohmann::json(SanitizeUtf8(inputs[i])).dump()
             << "\n  ours: " << JoinIds(ids) << "\n  want: " << JoinIds(want);
    }
  }
  EXPECT_EQ(mismatches, 0u) << mismatches << " of " << inputs.size() << " lines differ from "
                            << expected_file.filename() << report.str();
}

std::vector<std::string> InvalidUtf8Lines() {
  return SplitLines(ReadFileOrDie(CorpusDir() / "corpus_invalid_utf8.bin"));
}

TEST(TokenizerCorpus, IsLargeAndCoversInvalidUtf8) {
  EXPECT_GE(CorpusLines().size(), 2000u);
  size_t invalid = 0;
  for (const std::string& line : InvalidUtf8Lines()) invalid += IsValidUtf8(line) ? 0 : 1;
  EXPECT_GE(invalid, 80u);
}

TEST(TokenizerCorpus, QwenIdsMatchReference) {
  ExpectSameIds(Qwen(), CorpusLines(), CorpusDir() / "expected_qwen3.txt");
}

TEST(TokenizerCorpus, MixtralIdsMatchReference) {
  ExpectSameIds(Mixtral(), CorpusLines(), CorpusDir() / "expected_mixtral.txt");
}

TEST(TokenizerCorpus, QwenInvalidUtf8IsEncodedAsLossyText) {
  ExpectSameIds(Qwen(), InvalidUtf8Lines(), CorpusDir() / "expected_qwen3_invalid_utf8.txt");
}

TEST(TokenizerCorpus, MixtralInvalidUtf8IsEncodedAsLossyText) {
  ExpectSameIds(Mixtral(), InvalidUtf8Lines(), CorpusDir() / "expected_mixtral_invalid_utf8.txt");
}

TEST(TokenizerCorpus, InvalidUtf8EncodesLikeItsRepairedText) {
  for (const std::string& line : InvalidUtf8Lines()) {
    EXPECT_EQ(Qwen().Encode(line, false), Qwen().Encode(SanitizeUtf8(line), false));
    EXPECT_EQ(Mixtral().Encode(line, true), Mixtral().Encode(SanitizeUtf8(line), true));
  }
}

void ExpectDecodedLikeReference(const Tokenizer& tokenizer, const std::string& name) {
  const auto decoded =
      SplitLines(ReadFileOrDie(CorpusDir() / ("expected_" + name + "_decoded.jsonl")));
  ASSERT_EQ(decoded.size(), CorpusLines().size());
  size_t mismatches = 0;
  for (size_t i = 0; i < decoded.size(); ++i) {
    const std::string want = nlohmann::json::parse(decoded[i]).get<std::string>();
    const std::string got = tokenizer.Decode(tokenizer.Encode(CorpusLines()[i], false), false);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << name << " line " << i + 1 << " decodes to " << nlohmann::json(got).dump()
                    << ", reference " << nlohmann::json(want).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(TokenizerCorpus, QwenDecodeMatchesReference) {
  ExpectDecodedLikeReference(Qwen(), "qwen3");
}

TEST(TokenizerCorpus, MixtralDecodeMatchesReference) {
  ExpectDecodedLikeReference(Mixtral(), "mixtral");
}

// Byte-level BPE loses nothing but what the NFC normalizer changes: Decode(Encode(x)) is NFC(x),
// special-token strings included.
TEST(TokenizerCorpus, QwenRoundTripIsNfcOfTheText) {
  for (const std::string& line : CorpusLines()) {
    const auto ids = Qwen().Encode(line, false);
    ASSERT_EQ(Qwen().Decode(ids, false), Nfc(line)) << line;
  }
}

// SentencePiece style (Prepend '▁', spaces as '▁', decoder strips one leading space): a line
// without added-token strings and without '▁' itself comes back exactly. After an added token,
// Hugging Face starts a new section that gets its own '▁', so "a<s>b" decodes as "a<s> b" (the
// reference decodes above check those lines); skipping special tokens gives "a b".
TEST(TokenizerCorpus, MixtralRoundTripIsExactWithoutAddedTokens) {
  size_t checked = 0;
  for (const std::string& line : CorpusLines()) {
    if (line.find("<s>") != std::string::npos || line.find("</s>") != std::string::npos ||
        line.find("<unk>") != std::string::npos || line.find("\xE2\x96\x81") != std::string::npos) {
      continue;
    }
    ++checked;
    ASSERT_EQ(Mixtral().Decode(Mixtral().Encode(line, true), true), line);
    ASSERT_EQ(Mixtral().Decode(Mixtral().Encode(line, false), false), line);
  }
  EXPECT_GE(checked, 2000u);
  EXPECT_EQ(Mixtral().Decode(Mixtral().Encode("a<s>b", false), false), "a<s> b");
  EXPECT_EQ(Mixtral().Decode(Mixtral().Encode("a<s>b", false), true), "a b");
  EXPECT_EQ(Mixtral().Decode(Mixtral().Encode("<s>b", false), false), "<s> b");
}

void ExpectStreamEqualsDecode(const Tokenizer& tokenizer, bool skip_special) {
  for (const std::string& line : CorpusLines()) {
    const auto ids = tokenizer.Encode(line, true);
    StreamDecoder stream(tokenizer, skip_special);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = stream.Push(id);
      ASSERT_TRUE(IsValidUtf8(piece)) << line;
      streamed += piece;
    }
    streamed += stream.Flush();
    ASSERT_EQ(streamed, tokenizer.Decode(ids, skip_special)) << line;
  }
}

TEST(TokenizerCorpus, QwenStreamDecodeEqualsDecode) {
  ExpectStreamEqualsDecode(Qwen(), false);
  ExpectStreamEqualsDecode(Qwen(), true);
}

TEST(TokenizerCorpus, MixtralStreamDecodeEqualsDecode) {
  ExpectStreamEqualsDecode(Mixtral(), false);
  ExpectStreamEqualsDecode(Mixtral(), true);
}

}  // namespace
}  // namespace moetier::text::testing
