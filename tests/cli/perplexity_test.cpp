// `moetier perplexity` end to end through the built binary: the text tokenized with the model's
// tokenizer (its BOS first in every window where it adds one), the windows of --ctx measured as
// the library measures them (engine/perplexity.h, checked there against the logits), and its
// errors one line naming the flag or file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/perplexity.h"
#include "support/test_support.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier {
namespace {

using testing::RunCli;

// Sentences enough for a few windows of 24 tokens.
std::string Text() {
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "The expert banks of layer " + std::to_string(i) +
            " are pinned, locked or paged; each is read once.\n";
  return text;
}

TEST(Perplexity, EqualsTheLibrarysOverTheTokenizedTextWithTheBosFirst) {
  testing::TempDir tmp;
  const auto file = tmp.path() / "text.txt";
  testing::WriteFile(file, Text());
  // Mixtral's tokenizer puts <s> (1) before text; Qwen3's puts nothing.
  for (auto [fixture, bos] : {std::pair{"realvocab/mixtral_tiny", std::optional<int32_t>(1)},
                              std::pair{"realvocab/qwen3_moe_tiny", std::optional<int32_t>()}}) {
    SCOPED_TRACE(fixture);
    const auto dir = testing::HfFixture(fixture);
    // --kv-dtype f32: the library's engine keeps f32 K/V (a GPU's default is bf16).
    const auto r = RunCli("perplexity --model '" + dir.string() + "' --file '" + file.string() +
                          "' --ctx 24 --chunks 3 --parallel 2 --json -q --kv-dtype f32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["windows"], 3);
    EXPECT_EQ(j["ctx"], 24);
    EXPECT_EQ(j["tokens_scored"], 3 * 11);

    auto tok = text::Tokenizer::Load(dir);
    ASSERT_TRUE(tok.ok()) << tok.message();
    const std::vector<int32_t> tokens = tok->Encode(Text(), true);
    auto model = LoadCausalLM(dir, testing::WithThreads(1));
    ASSERT_TRUE(model.ok()) << model.message();
    EngineOptions eo;
    eo.kv_positions = 128;
    auto engine = Engine::Create(**model, nullptr, eo);
    ASSERT_TRUE(engine.ok()) << engine.message();
    PerplexityOptions o;
    o.ctx = 24;
    o.max_windows = 3;
    o.bos = bos;
    const auto want = MeasurePerplexity(**engine, tokens, o);
    ASSERT_TRUE(want.ok()) << want.message();
    EXPECT_NEAR(j["perplexity"].get<double>(), want->perplexity, 1e-4 * want->perplexity);
    EXPECT_NEAR(j["plus_minus"].get<double>(), want->plus_minus, 1e-3 * want->plus_minus);
  }
}

TEST(Perplexity, ErrorsNameTheFlagOrFile) {
  testing::TempDir tmp;
  const auto file = tmp.path() / "short.txt";
  testing::WriteFile(file, "Too short.");
  const std::string model =
      "--model '" + testing::HfFixture("realvocab/qwen3_moe_tiny").string() + "'";
  struct Case {
    std::string args, want;
  };
  for (const Case& c :
       {Case{"--file '" + file.string() + "' --ctx 16", "need at least 32"},
        Case{"--file /no/such.txt", "/no/such.txt"},
        Case{"--file '" + file.string() + "' --ctx 2", "--ctx"}, Case{"--ctx 16", "--file"}}) {
    const auto r = RunCli("perplexity " + model + " " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
}  // namespace moetier
