// Text generation on the real-vocabulary fixtures: Hugging Face's greedy text for every
// reference prompt, stop strings, streaming without broken UTF-8, and a chat whose KV cache
// reuse gives what a fresh prompt gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "engine/chat_session.h"
#include "engine/text_generation.h"
#include "support/test_support.h"

namespace moetier {
namespace {

bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

class TextGeneration : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::HfFixture(GetParam());
    auto m = LoadCausalLM(dir_, LoadOptions());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value();
    auto t = text::Tokenizer::Load(dir_);
    ASSERT_TRUE(t.ok()) << t.message();
    tok_ = std::make_unique<text::Tokenizer>(std::move(t).value());
    ref_ = nlohmann::json::parse(testing::ReadFile(dir_ / "reference_text.json"));
  }
  std::filesystem::path dir_;
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<text::Tokenizer> tok_;
  nlohmann::json ref_;
};

TEST_P(TextGeneration, GreedyTextMatchesHuggingFace) {
  for (const auto& t : ref_["texts"]) {
    const auto ids = tok_->Encode(t["text"].get<std::string>(), true);
    ASSERT_EQ(ids, t["ids"].get<std::vector<int32_t>>()) << t["text"];
    TextGenerationOptions o;
    o.tokens.max_new_tokens = static_cast<int64_t>(t["greedy_ids"].size());
    std::string streamed;
    auto engine = testing::MakeEngine(*model_, 128, tok_.get());
    auto r = GenerateText(*engine, ids, o, [&](std::string_view p) {
      EXPECT_TRUE(ValidUtf8(std::string(p))) << "broken UTF-8 piece";
      streamed += p;
    });
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(r->ids, t["greedy_ids"].get<std::vector<int32_t>>()) << t["text"];
    EXPECT_EQ(r->text, t["greedy_text"].get<std::string>()) << t["text"];
    EXPECT_EQ(streamed, r->text);
    EXPECT_EQ(r->reason, StopReason::kMaxTokens);
  }
}

TEST_P(TextGeneration, StopStringEndsTheTextBeforeIt) {
  const auto& t = ref_["texts"][0];
  const std::string full = t["greedy_text"].get<std::string>();
  const std::string stop = full.substr(full.size() / 2, 4);
  TextGenerationOptions o;
  o.tokens.max_new_tokens = 16;
  o.stop_strings = {stop};
  auto engine = testing::MakeEngine(*model_, 128, tok_.get());
  auto r = GenerateText(*engine, tok_->Encode(t["text"].get<std::string>(), true), o, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reason, StopReason::kStopString);
  EXPECT_EQ(r->text, full.substr(0, full.find(stop)));
}

// Generation that reaches the end of the context stops there with finish reason "length" and
// keeps what it produced: the same tokens as with room to spare, up to the limit. A prompt that
// does not fit at all is an error saying so.
TEST_P(TextGeneration, TheContextLimitEndsGenerationWithLength) {
  const auto& t = ref_["texts"][0];
  const auto ids = tok_->Encode(t["text"].get<std::string>(), true);
  const auto greedy = t["greedy_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(greedy.size(), 3u);
  TextGenerationOptions o;
  o.tokens.max_new_tokens = static_cast<int64_t>(greedy.size());
  const int64_t ctx = static_cast<int64_t>(ids.size()) + 2;  // room for 2 generated tokens
  auto engine = testing::MakeEngine(*model_, ctx, tok_.get());
  auto r = GenerateText(*engine, ids, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->reason, StopReason::kContextFull);
  EXPECT_EQ(StopReasonName(r->reason), "length");
  // Two tokens ran at the free positions; the third was sampled from the last one's logits.
  ASSERT_EQ(r->ids.size(), 3u);
  EXPECT_TRUE(std::equal(r->ids.begin(), r->ids.end(), greedy.begin()));

  auto small = testing::MakeEngine(*model_, static_cast<int64_t>(ids.size()) - 1, tok_.get());
  auto too_long = GenerateText(*small, ids, o, nullptr);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.message().find("--ctx-size"), std::string::npos) << too_long.message();
}

TEST_P(TextGeneration, ChatReusesTheCacheAndMatchesAFreshPrompt) {
  auto chat = text::ChatTemplate::Load(dir_);
  if (!chat.ok()) GTEST_SKIP() << "no chat template in this fixture: " << chat.message();
  TextGenerationOptions o;
  o.tokens.max_new_tokens = 6;
  auto engine = testing::MakeEngine(*model_, 512, tok_.get());
  ChatSession session(*engine, *tok_, *chat);
  auto first = session.Ask("Hi there!", o, nullptr, nullptr);
  ASSERT_TRUE(first.ok()) << first.message();
  EXPECT_EQ(first->usage.cached_tokens, 0);
  auto second = session.Ask("And again?", o, nullptr, nullptr);
  ASSERT_TRUE(second.ok()) << second.message();
  // The first turn's prompt and answer come from the prefix cache, in whole blocks.
  EXPECT_GE(second->usage.cached_tokens,
            first->prompt_tokens / KvPool::kDefaultBlockSize * KvPool::kDefaultBlockSize);
  // The same second turn from scratch, with an empty cache.
  text::ChatTemplateInputs in;
  in.messages = {{{"role", "user"}, {"content", "Hi there!"}},
                 {{"role", "assistant"}, {"content", first->text}},
                 {{"role", "user"}, {"content", "And again?"}}};
  in.tools = nullptr;
  in.add_generation_prompt = true;
  auto rendered = chat->Render(in);
  ASSERT_TRUE(rendered.ok());
  auto fresh = testing::MakeEngine(*model_, 512, tok_.get());
  auto again = GenerateText(*fresh, tok_->Encode(*rendered, false), o, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ids, second->ids);
  EXPECT_EQ(session.n_turns(), 4u);
  session.Reset();
  EXPECT_EQ(session.n_turns(), 0u);
}

INSTANTIATE_TEST_SUITE_P(RealVocab, TextGeneration,
                         ::testing::Values("realvocab/qwen3_moe_tiny", "realvocab/mixtral_tiny"),
                         [](const auto& info) { return info.param.substr(10); });

TEST(StopStringFilter, HoldsBackPossibleStartsAndCutsAtTheFirstStop) {
  StopStringFilter f({"</end>", "STOP"});
  EXPECT_EQ(f.Push("hello </e"), "hello ");
  EXPECT_EQ(f.Push("nx S"), "</enx ");
  EXPECT_EQ(f.Push("TOmore"), "STOmore");
  EXPECT_EQ(f.Push(" ok </end> tail"), " ok ");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.Push("more"), "");
  StopStringFilter g({"xyz"});
  EXPECT_EQ(g.Push("abx"), "ab");
  EXPECT_EQ(g.Flush(), "x");
}

}  // namespace
}  // namespace moetier
