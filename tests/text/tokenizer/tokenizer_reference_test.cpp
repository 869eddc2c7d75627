// Hugging Face's own ids (transformers, recorded in reference_text.json beside each real
// tokenizer) must come out of Encode token for token, and Decode must give back its text.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "text/tokenizer/test_tokenizers.h"

namespace moetier::text::testing {
namespace {

std::vector<int32_t> IdsOf(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

void CheckReferenceTexts(const Tokenizer& tokenizer, const std::filesystem::path& dir) {
  const auto ref = nlohmann::json::parse(ReadFileOrDie(dir / "reference_text.json"));
  ASSERT_GE(ref["texts"].size(), 5u);
  for (const auto& entry : ref["texts"]) {
    const std::string text = entry["text"].get<std::string>();
    const std::vector<int32_t> expected = IdsOf(entry["ids"]);
    const std::vector<int32_t> ids = tokenizer.Encode(text, /*add_special_tokens=*/true);
    EXPECT_EQ(ids, expected) << "text: " << text << "\n ours: " << JoinIds(ids)
                             << "\n   HF: " << JoinIds(expected);
    EXPECT_EQ(tokenizer.Decode(expected, /*skip_special_tokens=*/false),
              entry["roundtrip"].get<std::string>());
    EXPECT_EQ(tokenizer.Decode(expected, /*skip_special_tokens=*/true), text);
  }
}

TEST(TokenizerReference, QwenMatchesHuggingFaceIds) {
  CheckReferenceTexts(Qwen(), QwenDir());
}

TEST(TokenizerReference, MixtralMatchesHuggingFaceIds) {
  CheckReferenceTexts(Mixtral(), MixtralDir());
}

TEST(TokenizerReference, QwenChatRenderingMatchesHuggingFaceIds) {
  const auto ref = nlohmann::json::parse(ReadFileOrDie(QwenDir() / "reference_text.json"));
  const std::string rendered = ref["chat"]["rendered"].get<std::string>();
  const std::vector<int32_t> expected = IdsOf(ref["chat"]["ids"]);
  EXPECT_EQ(Qwen().Encode(rendered, true), expected);
  EXPECT_EQ(Qwen().Encode(rendered, false), expected);
  EXPECT_EQ(Qwen().Decode(expected, false), rendered);
}

TEST(TokenizerReference, ConfigFieldsOfTheRealTokenizers) {
  const TokenizerConfig& q = Qwen().config();
  EXPECT_EQ(q.eos_token, "<|im_end|>");
  EXPECT_EQ(q.eos_token_id, 151645);
  EXPECT_EQ(q.pad_token, "<|endoftext|>");
  EXPECT_EQ(q.pad_token_id, 151643);
  EXPECT_TRUE(q.bos_token.empty());
  EXPECT_FALSE(q.bos_token_id.has_value());
  EXPECT_FALSE(q.add_bos_token);
  EXPECT_NE(q.chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(q.chat_template_json).get<std::string>(), q.chat_template);
  EXPECT_EQ(Qwen().vocab_size(), 151669);
  EXPECT_TRUE(Qwen().IsSpecial(151644));
  EXPECT_FALSE(Qwen().IsSpecial(151657));  // <tool_call> is added but not special
  EXPECT_EQ(Qwen().TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ(Qwen().IdToToken(9707), "Hello");
  EXPECT_EQ(Qwen().IdToToken(1879), "\xC4\xA0world");  // byte-level spelling of " world"

  const TokenizerConfig& m = Mixtral().config();
  EXPECT_EQ(m.bos_token, "<s>");
  EXPECT_EQ(m.bos_token_id, 1);
  EXPECT_EQ(m.eos_token_id, 2);
  EXPECT_EQ(m.unk_token_id, 0);
  EXPECT_TRUE(m.add_bos_token);
  EXPECT_FALSE(m.add_eos_token);
  EXPECT_TRUE(m.chat_template_json.empty());
  EXPECT_EQ(Mixtral().vocab_size(), 32000);
  EXPECT_EQ(Mixtral().IdToToken(22557), "\xE2\x96\x81Hello");
  EXPECT_EQ(Mixtral().IdToToken(-1), "");
  EXPECT_EQ(Mixtral().IdToToken(32000), "");
}

}  // namespace
}  // namespace moetier::text::testing
