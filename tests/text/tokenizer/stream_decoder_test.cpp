// StreamDecoder: text comes out only when final, never as a broken UTF-8 sequence, and all of it
// together equals Decode of the whole id list.
#include <gtest/gtest.h>

#include "text/tokenizer/decoder.h"
#include "text/tokenizer/test_tokenizers.h"
#include "text/tokenizer/utf8.h"

namespace moetier::text::testing {
namespace {

using Ids = std::vector<int32_t>;

// Pushes every id, checking each piece is valid UTF-8; returns the pieces (Flush last).
std::vector<std::string> Stream(const Tokenizer& t, const Ids& ids, bool skip_special) {
  StreamDecoder stream(t, skip_special);
  std::vector<std::string> pieces;
  for (const int32_t id : ids) {
    pieces.push_back(stream.Push(id));
    EXPECT_TRUE(IsValidUtf8(pieces.back()));
  }
  pieces.push_back(stream.Flush());
  return pieces;
}

std::string Concat(const std::vector<std::string>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p;
  return s;
}

TEST(StreamDecoderTest, QwenCharacterSplitAcrossByteLevelTokens) {
  // In Qwen3's vocabulary " 🌍" is three tokens: " " + F0 9F, 8C, 8D.
  const Ids ids = Qwen().Encode("Hi \xF0\x9F\x8C\x8D!", false);
  ASSERT_EQ(ids.size(), 5u) << JoinIds(ids);
  const auto pieces = Stream(Qwen(), ids, false);
  EXPECT_EQ(pieces[0], "Hi");
  EXPECT_EQ(pieces[1], "");  // " " + half an emoji: held back
  EXPECT_EQ(pieces[2], "");
  EXPECT_EQ(pieces[3], " \xF0\x9F\x8C\x8D");
  EXPECT_EQ(pieces[4], "!");
  EXPECT_EQ(pieces[5], "");
  EXPECT_EQ(Concat(pieces), "Hi \xF0\x9F\x8C\x8D!");
}

TEST(StreamDecoderTest, MixtralEmojiThroughByteFallbackTokens) {
  // 🦀 is not in the 32k vocabulary: it becomes four <0xNN> tokens.
  const std::string text = "crab \xF0\x9F\xA6\x80 walks";
  const Ids ids = Mixtral().Encode(text, true);
  size_t byte_tokens = 0;
  for (const int32_t id : ids) byte_tokens += Decoder::IsByteToken(Mixtral().IdToToken(id));
  ASSERT_EQ(byte_tokens, 4u) << JoinIds(ids);
  const auto pieces = Stream(Mixtral(), ids, true);
  EXPECT_EQ(Concat(pieces), text);
  EXPECT_EQ(Concat(pieces), Mixtral().Decode(ids, true));
  // No piece holds part of the emoji.
  for (const auto& p : pieces) {
    if (p.find('\xF0') != std::string::npos) {
      EXPECT_NE(p.find("\xF0\x9F\xA6\x80"), std::string::npos);
    }
  }
  EXPECT_EQ(Concat(Stream(Mixtral(), ids, false)), "<s> " + text);
}

TEST(StreamDecoderTest, ByteRunThatTurnsInvalidLaterIsNotReturnedEarly) {
  // Hugging Face decodes a run of byte tokens as a whole: C3 A9 is "é", but C3 A9 FF is three
  // U+FFFD. The stream must wait for the run to end to give the same text.
  const auto id = [](const char* token) { return *Mixtral().TokenToId(token); };
  const Ids ids = {id("<0xC3>"), id("<0xA9>"), id("<0xFF>"),
                   id("\xE2\x96\x81"
                      "a")};
  const auto pieces = Stream(Mixtral(), ids, false);
  EXPECT_EQ(Concat(pieces), Mixtral().Decode(ids, false));
  EXPECT_EQ(Concat(pieces), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD a");
}

TEST(StreamDecoderTest, FlushReturnsAnUnfinishedCharacterAsReplacement) {
  const Ids ids = Qwen().Encode("\xF0\xAA\x9B\x96", false);  // a rare CJK character
  ASSERT_GE(ids.size(), 2u);
  StreamDecoder stream(Qwen(), false);
  EXPECT_EQ(stream.Push(ids[0]), "");
  EXPECT_EQ(stream.Flush(), Qwen().Decode(Ids{ids[0]}, false));
  EXPECT_EQ(stream.Flush(), "");
}

TEST(StreamDecoderTest, SpecialTokensAndUnknownIds) {
  const Ids ids = Qwen().Encode("<|im_start|>user\nHi<|im_end|>", false);
  EXPECT_EQ(Concat(Stream(Qwen(), ids, false)), "<|im_start|>user\nHi<|im_end|>");
  EXPECT_EQ(Concat(Stream(Qwen(), ids, true)), "user\nHi");
  Ids with_unknown = ids;
  with_unknown.insert(with_unknown.begin() + 1, 999999999);
  EXPECT_EQ(Concat(Stream(Qwen(), with_unknown, false)), Qwen().Decode(ids, false));
}

TEST(StreamDecoderTest, SentencePieceLeadingSpaceOnlyAtTheStart) {
  // The first token's '▁' is stripped once; later ones are spaces.
  const Ids ids = Mixtral().Encode("Hello big world", false);
  const auto pieces = Stream(Mixtral(), ids, false);
  EXPECT_EQ(pieces[0], "Hello");
  EXPECT_EQ(Concat(pieces), "Hello big world");
}

}  // namespace
}  // namespace moetier::text::testing
