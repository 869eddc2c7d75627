// Hostile and clumsy command lines: each class of mistake gets one clear line on stderr that
// starts with "error:" and names the flag, file or variable, and a non-zero exit — never a
// crash, a hang, garbage or a silent success. The crash classes also run under ASan+UBSan.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;
using testing::RunCli;

std::string Quote(const fs::path& p) {
  return "'" + p.string() + "'";
}
std::string Model(const std::string& rel = "qwen3_moe") {
  return "--model " + Quote(testing::HfFixture(rel));
}

// The contract: exit 1 (2 for a command line that does not parse), stderr's only "error:" line
// is its last line, and it holds `needle`.
void ExpectOneLineError(const testing::CommandResult& r, const std::string& needle,
                        const std::string& what) {
  EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << what << ": exit " << r.exit_code << "\n"
                                                    << r.err;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  const size_t nl = err.rfind('\n');
  const std::string last = nl == std::string::npos ? err : err.substr(nl + 1);
  EXPECT_EQ(last.rfind("error: ", 0), 0u) << what << "\n" << r.err;
  EXPECT_EQ(err.find("error: "), err.size() - last.size()) << what << ": more than one error line\n"
                                                           << r.err;
  EXPECT_NE(last.find(needle), std::string::npos) << what << ": want '" << needle << "'\n" << r.err;
}

// Numeric flags: NaN, infinities and out-of-range values are refused with the range in words,
// never CLI11's 309-digit bounds.
TEST(CliErrors, NumericFlagsStateTheirRangeAndRefuseNanAndInf) {
  struct Case {
    std::string args, needle;
  };
  const std::string gen = "generate " + Model() + " --tokens 1 ";
  const Case cases[] = {
      {gen + "--threads -1", "--threads"},
      {gen + "--threads 100000", "--threads"},
      {gen + "--ctx-size -5", "--ctx-size"},
      {gen + "--temperature nan", "--temperature: must be a finite number"},
      {gen + "--temperature inf", "--temperature"},
      {gen + "--temperature -1", "--temperature"},
      {gen + "--top-p 0", "--top-p: must be a finite number in (0, 1]"},
      {gen + "--top-p nan", "--top-p"},
      {gen + "--min-p 2", "--min-p"},
      {gen + "--repetition-penalty 0", "--repetition-penalty"},
      {gen + "--repetition-penalty -inf", "--repetition-penalty"},
      {gen + "--top-k -3", "--top-k: must be a whole number"},
      {gen + "-n -1", "--max-new-tokens"},
      {gen + "--seed -2", "--seed"},
      {gen + "--seed abc", "--seed"},
      {gen + "--pin-budget-gb nan", "--pin-budget-gb"},
      {gen + "--lock-budget-gb -1", "--lock-budget-gb"},
      {"bench " + Model() + " --bandwidth-mib nan", "--bandwidth-mib"},
      {"bench " + Model() + " --bandwidth-mib 1048576", "--bandwidth-mib"},
      {"bench " + Model() + " --repeats 0", "--repeats"},
      {"bench " + Model() + " --top-p 0", "--top-p"},
      {"bench " + Model() + " --temperature -1", "--temperature"},
  };
  for (const auto& c : cases) {
    const auto r = RunCli(c.args);
    ExpectOneLineError(r, c.needle, c.args);
    EXPECT_EQ(r.err.find("1797"), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.find("experts "), std::string::npos) << c.args << ": loaded weights first";
  }
}

TEST(CliErrors, UnknownOrMissingCommandListsTheCommands) {
  auto typo = RunCli("genrate " + Model() + " --tokens 1");
  ExpectOneLineError(typo, "unknown command 'genrate' (did you mean 'generate'?)", "typo");
  EXPECT_NE(typo.err.find("run, generate, logits"), std::string::npos) << typo.err;
  ExpectOneLineError(RunCli(""), "no command given; the commands are run", "nothing");
  ExpectOneLineError(RunCli("generate --frobnicate " + Model() + " --tokens 1"), "--frobnicate",
                     "unknown flag");
  ExpectOneLineError(RunCli("generate --tokens 1"), "--model", "missing --model");
}

// Thread counts past what the machine can run fail before anything starts (once an uncaught
// std::system_error).
TEST(CliErrors, AbsurdThreadCountsAreRefused) {
  ExpectOneLineError(RunCli("generate " + Model() + " --tokens 1 --threads 100000"), "--threads",
                     "threads");
}

TEST(CliErrors, SymlinkLoopsAndFifosAreErrorsNotCrashesOrHangs) {
  testing::TempDir tmp;
  const fs::path loop = tmp.path() / "loop";
  fs::create_symlink(loop, loop);
  ExpectOneLineError(RunCli("generate --model " + Quote(loop) + " --tokens 1"), "loop",
                     "loop as --model");
  ExpectOneLineError(RunCli("plan --model " + Quote(loop)), "loop", "loop as plan --model");

  const fs::path model = tmp.path() / "model";
  testing::CopyDir(testing::HfFixture("qwen3_moe"), model);
  fs::remove(model / "config.json");
  ASSERT_EQ(::mkfifo((model / "config.json").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  ExpectOneLineError(RunCli("generate --model " + Quote(model) + " --tokens 1"),
                     "not a regular file", "FIFO config.json");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));

  const fs::path fifo = tmp.path() / "prompt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectOneLineError(
      RunCli("generate " + Model("realvocab/qwen3_moe_tiny") + " --prompt-file " + Quote(fifo)),
      "--prompt-file", "FIFO prompt");
  ExpectOneLineError(
      RunCli("tokenize " + Model("realvocab/qwen3_moe_tiny") + " --file " + Quote(tmp.path())),
      "is a directory", "tokenize --file DIR");
}

// Output paths and flags are checked before the weights load (no residency line on stderr).
TEST(CliErrors, OutputPathsAreCheckedBeforeTheWeightsLoad) {
  testing::TempDir tmp;
  for (const std::string& out : {tmp.path().string(), std::string("/etc/passwd/x"),
                                 (tmp.path() / "missing" / "f").string()}) {
    const auto r = RunCli("logits " + Model() + " --tokens 1 --out '" + out + "'");
    ExpectOneLineError(r, "(--out)", out);
    EXPECT_EQ(r.err.find("experts "), std::string::npos) << r.err;
    const auto rep = RunCli("generate " + Model() + " --tokens 1 --report '" + out + "'");
    ExpectOneLineError(rep, "(--report)", out);
  }
  const auto vocab =
      RunCli("logits " + Model() + " --tokens 1,100000 --out " + Quote(tmp.path() / "l.bin"));
  ExpectOneLineError(vocab, "--tokens: token id 100000 is outside", "token id");
  EXPECT_EQ(vocab.err.find("experts "), std::string::npos) << vocab.err;
  EXPECT_FALSE(fs::exists(tmp.path() / "l.bin"));
  ExpectOneLineError(RunCli("generate " + Model() + " --tokens 1 --kv-dtype f8"), "--kv-dtype",
                     "kv dtype");
  ExpectOneLineError(RunCli("generate " + Model() + " --tokens 1 --ctx-size 8 --kv-cache-gb 1"),
                     "--kv-cache-gb", "both KV sizes");
  ExpectOneLineError(RunCli("generate " + Model() + " --tokens 1 --kv-host-gb 100000"),
                     "--kv-host-gb 100000.00: only", "a host KV tier past the RAM");
}

// Templates and conversations that nest absurdly deep: one error line, from `template` and
// from `run`, never a stack overflow.
TEST(CliErrors, DeepTemplatesAndMessagesAreErrors) {
  testing::TempDir tmp;
  const fs::path model = tmp.path() / "model";
  testing::CopyDir(testing::HfFixture("realvocab/qwen3_moe_tiny"), model);
  std::string chain = "{% if false %}{{ 1";
  for (int i = 0; i < 10000; ++i) chain += "+1";
  chain += " }}{% endif %}";
  testing::WriteFile(model / "chat_template.jinja", chain);
  testing::WriteFile(tmp.path() / "m.json", R"({"messages": [{"role": "user", "content": "hi"}]})");
  ExpectOneLineError(
      RunCli("template --model " + Quote(model) + " --messages " + Quote(tmp.path() / "m.json")),
      "nest deeper than", "deep template");
  ExpectOneLineError(RunCli("run --model " + Quote(model) + " -p hi -n 2"), "nest deeper than",
                     "deep template in run");
  std::string deep = R"({"messages": [{"role": "user", "content": )";
  for (int i = 0; i < 1000000; ++i) deep += "[";
  for (int i = 0; i < 1000000; ++i) deep += "]";
  deep += "}]}";
  testing::WriteFile(tmp.path() / "deep.json", deep);
  ExpectOneLineError(RunCli("template " + Model("realvocab/qwen3_moe_tiny") + " --messages " +
                            Quote(tmp.path() / "deep.json")),
                     "nested deeper than", "deep messages");
}

TEST(CliErrors, FlagsThatDoNothingSaySo) {
  ExpectOneLineError(RunCli("generate " + Model() + " --tokens 1 --chat"), "--chat",
                     "--chat with --tokens");
  ExpectOneLineError(
      RunCli("generate " + Model("realvocab/qwen3_moe_tiny") + " --prompt hi --system x"), "--chat",
      "--system without --chat");
}

TEST(CliErrors, MalformedEnvironmentVariablesNameTheVariable) {
  for (const std::string& env :
       {std::string("MOETIER_TASK_ROWS=abc"), std::string("MOETIER_SPIN_US=-5"),
        std::string("MOETIER_PIN_THREADS=2"), std::string("MOETIER_CPU_ISA=pentium"),
        std::string("MOETIER_INJECT_FAILURES=pin=x")}) {
    const std::string name = env.substr(0, env.find('='));
    ExpectOneLineError(RunCli("generate " + Model() + " --tokens 1", "/dev/null", env), name, env);
  }
  const auto typo =
      RunCli("generate " + Model() + " --tokens 1 -n 1", "/dev/null", "MOETIER_TASKROWS=8");
  EXPECT_EQ(typo.exit_code, 0) << typo.err;
  EXPECT_NE(typo.err.find("warning: environment variable MOETIER_TASKROWS"), std::string::npos)
      << typo.err;
}

// The end of the context ends generation with what was produced, and says why.
TEST(CliErrors, GenerationStopsAtTheContextLimit) {
  const auto r = RunCli("generate " + Model() + " --tokens 3,17,42 -n 20 --ctx-size 6");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string out = r.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  // 3 positions free after the prompt: 3 tokens run, a 4th sampled from the last.
  EXPECT_EQ(std::count(out.begin(), out.end(), ',') + 1, 4) << r.out;
  EXPECT_NE(r.err.find("the context of 6 positions is full"), std::string::npos) << r.err;
  // A limit far past the context: the context ends it, nothing is reserved for the rest.
  const auto huge =
      RunCli("generate " + Model() + " --tokens 3,17,42 -n 9223372036854775807 " + "--ctx-size 6");
  EXPECT_EQ(huge.exit_code, 0) << huge.err;
  EXPECT_EQ(huge.out, r.out);
  const auto too_long = RunCli("generate " + Model() + " --tokens 3,17,42,5 --ctx-size 3");
  ExpectOneLineError(too_long, "--ctx-size", "prompt longer than the context");
}

TEST(CliErrors, SeedMinusOneIsRandomAndTinyTemperatureIsGreedy) {
  const std::string base = "generate " + Model() + " --tokens 3,17,42 -n 8 ";
  const auto greedy = RunCli(base);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  const auto tiny = RunCli(base + "--temperature 1e-40 --seed -1");
  ASSERT_EQ(tiny.exit_code, 0) << tiny.err;
  EXPECT_EQ(tiny.out, greedy.out);
}

TEST(CliErrors, MoeCpuLayersIdsAreCheckedUnderEveryBackend) {
  EXPECT_EQ(RunCli("plan " + Model() + " --moe-cpu-layers 0-3").exit_code, 0);
  for (const char* backend : {"cpu", "offload", "auto"})
    ExpectOneLineError(
        RunCli("plan " + Model() + " --moe-backend " + backend + " --moe-cpu-layers 9,"),
        "--moe-cpu-layers: layer 9 is not a MoE layer", backend);
}

TEST(CliErrors, HelpShowsDefaultsAndTheirMeaning) {
  const auto gen = RunCli("generate --help");
  ASSERT_EQ(gen.exit_code, 0);
  EXPECT_NE(gen.out.find("0 = one per physical core"), std::string::npos) << gen.out;
  EXPECT_NE(gen.out.find("-1 = a random seed"), std::string::npos) << gen.out;
  EXPECT_NE(gen.out.find("0-3"), std::string::npos) << gen.out;
  EXPECT_NE(gen.out.find("32"), std::string::npos) << gen.out;  // --max-new-tokens' default
  const auto run = RunCli("run --help");
  EXPECT_NE(run.out.find("/quit"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace moetier
