// The two CLI interfaces that external checks use (`logits`, `generate`), end to end through the
// built binary, and the CLI's error contract: one line on stderr, non-zero exit.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "model/causal_lm.h"
#include "support/test_support.h"

namespace moetier {
namespace {

using testing::RunCli;

std::string Model(const std::string& rel = "qwen3_moe") {
  return "--model '" + testing::HfFixture(rel).string() + "'";
}

std::string LastLine(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// "1,2,3" from an int64 tensor.
std::string Join(const TensorView& ids) {
  std::string s;
  for (int64_t i = 0; i < ids.NumElements(); ++i) {
    if (i) s.push_back(',');
    s.append(std::to_string(ids.as<int64_t>()[i]));
  }
  return s;
}

TEST(Cli, LogitsWritesRowMajorFloat32OfEveryPosition) {
  testing::TempDir tmp;
  const auto out = tmp.path() / "logits.bin";
  auto r = RunCli("logits " + Model() + " --tokens 3,17,42 --out '" + out.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string bytes = testing::ReadFile(out);
  ASSERT_EQ(bytes.size(), 3u * 512u * 4u);

  auto model = LoadCausalLM(testing::HfFixture("qwen3_moe"), LoadOptions{});
  ASSERT_TRUE(model.ok());
  KvCache cache = (*model)->NewCache(8);
  std::vector<float> want;
  const std::vector<int32_t> tokens = {3, 17, 42};
  ASSERT_TRUE((*model)->Forward(tokens, cache, LogitsFor::kAllTokens, want).ok());
  std::vector<float> got(want.size());
  std::memcpy(got.data(), bytes.data(), bytes.size());
  EXPECT_EQ(got, want);
}

TEST(Cli, GenerateGreedyMatchesReference) {
  auto ref = SafetensorsFile::Open(testing::HfFixture("mixtral") / "reference.safetensors");
  ASSERT_TRUE(ref.ok());
  const TensorView* tokens = ref->Find("prompt1.tokens");
  const TensorView* greedy = ref->Find("prompt1.greedy");
  const std::string prompt = Join(*tokens), want = Join(*greedy);
  auto r = RunCli("generate " + Model("mixtral") + " --tokens " + prompt +
                  " --max-new-tokens 24 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(LastLine(r.out), want);
}

TEST(Cli, SeededSamplingIsReproducible) {
  const std::string args = "generate " + Model() + " --tokens 5,6,7 -n 16 --temperature 1.5 --seed ";
  auto a = RunCli(args + "11"), b = RunCli(args + "11"), c = RunCli(args + "12");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(LastLine(a.out), LastLine(b.out));
  EXPECT_NE(LastLine(a.out), LastLine(c.out));  // 16 draws at T=1.5 over 512 tokens
}

TEST(Cli, ErrorsAreOneLineAndNonZero) {
  struct Case {
    std::string args;
    const char* needle;
  };
  testing::TempDir tmp;
  const Case cases[] = {
      {"generate " + Model() + " --tokens 3,x,4", "--tokens: 'x' is not a token id"},
      {"generate " + Model() + " --tokens 3,999999", "token id 999999"},
      {"generate --model '" + tmp.path().string() + "/none' --tokens 1", "not a directory"},
      {"logits --model '" + tmp.path().string() + "' --tokens 1 --out x", "config.json: cannot open"},
      {"logits " + Model() + " --tokens 1 --out '" + tmp.path().string() + "/no/such/dir/f'",
       "cannot open for writing"},
  };
  for (const auto& c : cases) {
    auto r = RunCli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    // Progress and residency lines may come first; the error is the last line, and the only one.
    const std::string last = LastLine(r.err);
    EXPECT_EQ(last.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(r.err.find("error: "), r.err.size() - last.size() - 1) << r.err;
    EXPECT_NE(last.find(c.needle), std::string::npos) << r.err;
  }
}

TEST(Cli, HelpExplainsEachCommand) {
  for (const char* cmd : {"", "generate ", "logits "}) {
    auto r = RunCli(std::string(cmd) + "--help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--"), std::string::npos) << r.out;
  }
  auto bad = RunCli("generate --frobnicate");
  EXPECT_NE(bad.exit_code, 0);
}

}  // namespace
}  // namespace moetier
