// The two CLI interfaces that external checks use (`logits`, `generate`), end to end through the
// built binary, and the CLI's error contract: one line on stderr, non-zero exit.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "experts/host_memory.h"
#include "io/safetensors.h"
#include "kernels/cpu/cpu_isa.h"
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
  KvCache cache = *(*model)->NewCache(8);
  std::vector<float> want;
  const std::vector<int32_t> tokens = {3, 17, 42};
  ASSERT_TRUE((*model)->Forward(tokens, cache, LogitsFor::kAllTokens, want).ok());
  std::vector<float> got(want.size());
  std::memcpy(got.data(), bytes.data(), bytes.size());
  EXPECT_EQ(got, want);
}

// --moe-collect-stats: every MoE layer counted once per step, every expert on the CPU (the cpu
// backend), the totals in --report and a summary on stderr.
TEST(Cli, CollectStatsCountsEveryLayerOfEveryStep) {
  testing::TempDir tmp;
  const auto report = tmp.path() / "report.json";
  auto r = RunCli("generate " + Model() + " --tokens 3,17,42 -n 4 --moe-backend cpu " +
                  "--moe-collect-stats --report '" + report.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("expert stats:"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(testing::ReadFile(report));
  ASSERT_TRUE(j.contains("expert_stats")) << j.dump();
  const auto& layers = j["expert_stats"]["layers"];
  auto model = LoadCausalLM(testing::HfFixture("qwen3_moe"), LoadOptions{});
  ASSERT_TRUE(model.ok());
  ASSERT_EQ(static_cast<int64_t>(layers.size()), (*model)->config().n_moe_layers());
  // One prefill step and one step for each generated token but the last (sampled from the step
  // before it): 4 steps.
  for (const auto& l : layers) {
    EXPECT_EQ(l["calls"].get<int64_t>(), 4) << l.dump();
    EXPECT_EQ(l["cpu_experts"], l["active_experts"]) << l.dump();
    EXPECT_EQ(l["gpu_experts"].get<int64_t>(), 0);
    // The prompt's 3 tokens, then 1 token a step, each with top-k experts.
    EXPECT_EQ(l["assignments"].get<int64_t>(), (3 + 3) * (*model)->config().n_experts_per_token);
  }
}

// --moe-backend gpu where no GPU answers: the CPU engine, the same tokens, one line saying so.
TEST(Cli, GpuBackendWithoutAGpuRunsOnTheCpuAndSaysSo) {
  if (GpuAvailable()) GTEST_SKIP() << "a GPU is present: the gpu backend runs on it";
  const std::string args = "generate " + Model() + " --tokens 3,17,42 -n 3 --moe-backend ";
  auto gpu = RunCli(args + "gpu"), cpu = RunCli(args + "cpu");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(gpu.out, cpu.out);
  EXPECT_NE(gpu.err.find("no usable CUDA device"), std::string::npos) << gpu.err;
}

// --no-gpu: the CPU engine whatever is present; on a GPU machine the gpu backend then says it
// runs on the CPU, and every backend gives the CPU's tokens.
TEST(Cli, NoGpuRunsEverythingOnTheCpu) {
  const std::string args = "generate " + Model() + " --tokens 3,17,42 -n 3 --no-gpu --moe-backend ";
  auto gpu = RunCli(args + "gpu"), offload = RunCli(args + "offload"), cpu = RunCli(args + "cpu");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  ASSERT_EQ(offload.exit_code, 0) << offload.err;
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(gpu.out, cpu.out);
  EXPECT_EQ(offload.out, cpu.out);
  EXPECT_NE(gpu.err.find("--no-gpu"), std::string::npos) << gpu.err;
}

// --log-level, -q and -v, before or after the command's name, choose what stderr says besides
// errors and the command's own result; an unknown MOETIER_ variable's warning shows which
// levels keep warnings.
TEST(Cli, LogLevelChoosesWhatStderrSays) {
  testing::TempDir tmp;
  const std::string logits =
      "logits " + Model() + " --tokens 3,17 --out '" + (tmp.path() / "l.bin").string() + "'";
  const std::string unknown = "MOETIER_NOT_A_KNOB=1";
  const auto run = [&](const std::string& args) { return RunCli(args, "/dev/null", unknown); };
  const testing::CommandResult info = run(logits), quiet_after = run(logits + " -q"),
                               quiet_before = run("-q " + logits), debug = run(logits + " -v"),
                               silent = run(logits + " --log-level quiet"),
                               both = run(logits + " -q -v"),
                               bad = run(logits + " --log-level loud");
  for (const auto* r : {&info, &quiet_after, &quiet_before, &debug, &silent})
    ASSERT_EQ(r->exit_code, 0) << r->err;
  const auto has = [](const testing::CommandResult& r, const char* s) {
    return r.err.find(s) != std::string::npos;
  };
  EXPECT_TRUE(has(info, "load: ") && has(info, "MOETIER_NOT_A_KNOB") && !has(info, "debug: "))
      << info.err;
  EXPECT_TRUE(!has(quiet_after, "load: ") && has(quiet_after, "MOETIER_NOT_A_KNOB"))
      << quiet_after.err;
  EXPECT_EQ(quiet_before.err, quiet_after.err);
  EXPECT_TRUE(has(debug, "debug: bank 0 read in") && has(debug, "load: ")) << debug.err;
  EXPECT_TRUE(!has(silent, "load: ") && !has(silent, "MOETIER_NOT_A_KNOB")) << silent.err;
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_TRUE(has(both, "--quiet excludes --verbose")) << both.err;
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(has(bad, "--log-level: loud not in")) << bad.err;
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
  const std::string args =
      "generate " + Model() + " --tokens 5,6,7 -n 16 --temperature 1.5 --seed ";
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
      {"logits --model '" + tmp.path().string() + "' --tokens 1 --out x",
       "config.json: cannot open"},
      {"logits " + Model() + " --tokens 1 --out '" + tmp.path().string() + "/no/such/dir/f'",
       "cannot write (--out)"},
      {"logits " + Model() + " --tokens 1 --out x --dense-memory anon",
       "--dense-memory: 'anon' is not one of auto, copy, mapped"},
      {"logits " + Model() + " --tokens 1 --out x --weight-packing fast",
       "--weight-packing: 'fast' is not one of auto, none, bf16c"},
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

// --no-gpu: the CPU engine reproduces Hugging Face's greedy text exactly; a GPU's may leave it at
// a near tie of these tiny models (the model tests check the GPU's continuations against the
// fixtures' margins).
TEST(Cli, GeneratePromptPrintsHuggingFacesGreedyText) {
  for (const char* fixture : {"realvocab/qwen3_moe_tiny", "realvocab/mixtral_tiny"}) {
    const auto ref = nlohmann::json::parse(
        testing::ReadFile(testing::HfFixture(fixture) / "reference_text.json"));
    for (const auto& t : ref["texts"]) {
      testing::TempDir tmp;
      testing::WriteFile(tmp.path() / "prompt.txt", t["text"].get<std::string>());
      auto r = RunCli("generate " + Model(fixture) + " --prompt-file '" +
                      (tmp.path() / "prompt.txt").string() + "' --no-gpu -n " +
                      std::to_string(t["greedy_ids"].size()));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, t["greedy_text"].get<std::string>() + "\n") << fixture << ": " << t["text"];
    }
  }
}

TEST(Cli, RunAnswersOnceAndChatsOverStdin) {
  auto once = RunCli("run " + Model("realvocab/qwen3_moe_tiny") + " -p 'Hello!' -n 8 --seed 1");
  ASSERT_EQ(once.exit_code, 0) << once.err;
  EXPECT_GT(once.out.size(), 1u);

  testing::TempDir tmp;
  testing::WriteFile(tmp.path() / "in.txt", "Hi there!\n/reset\nHi there!\n/exit\nnever read\n");
  const std::string cmd = "run " + Model("realvocab/qwen3_moe_tiny") + " -n 6 --temperature 0";
  auto chat = RunCli(cmd, (tmp.path() / "in.txt").string());
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_NE(chat.err.find("(conversation forgotten)"), std::string::npos) << chat.err;
  // Greedy and reset: both answers to the same first message are the same line.
  std::vector<std::string> lines;
  std::string line;
  std::istringstream ss(chat.out);
  while (std::getline(ss, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << chat.out;
  EXPECT_EQ(lines[0], lines[1]);
}

TEST(Cli, TokenizeAndTemplateCommands) {
  testing::TempDir tmp;
  const auto ref = nlohmann::json::parse(
      testing::ReadFile(testing::HfFixture("realvocab/qwen3_moe_tiny") / "reference_text.json"));
  std::string lines, want;
  for (const auto& t : ref["texts"]) {
    const std::string text = t["text"].get<std::string>();
    if (text.find('\n') != std::string::npos) continue;  // tokenize splits on \n
    lines += text + "\n";
    std::string ids;
    for (const auto& id : t["ids"]) {
      if (!ids.empty()) ids.push_back(',');
      ids.append(std::to_string(id.get<int>()));
    }
    want += ids + "\n";
  }
  testing::WriteFile(tmp.path() / "lines.txt", lines);
  auto tok = RunCli("tokenize " + Model("realvocab/qwen3_moe_tiny") + " --file '" +
                    (tmp.path() / "lines.txt").string() + "'");
  ASSERT_EQ(tok.exit_code, 0) << tok.err;
  EXPECT_EQ(tok.out, want);

  nlohmann::json messages = {{"messages", ref["chat"]["messages"]}};
  testing::WriteFile(tmp.path() / "m.json", messages.dump());
  auto tpl = RunCli("template " + Model("realvocab/qwen3_moe_tiny") + " --messages '" +
                    (tmp.path() / "m.json").string() + "' --add-generation-prompt");
  ASSERT_EQ(tpl.exit_code, 0) << tpl.err;
  EXPECT_EQ(tpl.out, ref["chat"]["rendered"].get<std::string>());

  auto bad = RunCli("template " + Model("realvocab/qwen3_moe_tiny") + " --messages '" +
                    (tmp.path() / "none.json").string() + "'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("none.json"), std::string::npos) << bad.err;
}

TEST(Cli, HelpExplainsEachCommand) {
  for (const char* cmd : {"", "generate ", "logits ", "run ", "convert ", "plan ", "tokenize ",
                          "template ", "perplexity "}) {
    auto r = RunCli(std::string(cmd) + "--help");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--"), std::string::npos) << r.out;
  }
  auto bad = RunCli("generate --frobnicate");
  EXPECT_NE(bad.exit_code, 0);
}

}  // namespace
}  // namespace moetier

namespace moetier {
namespace {

// `moetier bench --json`: the keys external checks read, consistent with each other, and the
// per-phase decode times of --profile adding up to no more than the whole forward.
TEST(Cli, BenchJsonHasTheKeysAndConsistentFigures) {
  const auto r = testing::RunCli("bench " + Model() +
                                 " --prompt-tokens 5 --gen-tokens 4 --repeats 1 --threads 2"
                                 " --json --profile --bandwidth-mib 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(LastLine(r.out));
  for (const char* key : {"prefill_tokens_per_s", "decode_tokens_per_s", "decode_bytes_per_token",
                          "decode_gb_per_s", "read_bandwidth_gb_per_s", "threads", "dtype"})
    ASSERT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["threads"].get<int>(), 2);
  EXPECT_EQ(j["dtype"].get<std::string>(), "BF16");
  // The cpu backend (auto without a GPU) says where dense weights streamed from (copied unless
  // RAM is short); with a GPU the backend is hybrid and the key is empty.
  ASSERT_TRUE(j.contains("dense_memory"));
  const std::string dense = j["dense_memory"].get<std::string>();
  if (!GpuAvailable()) {
    EXPECT_TRUE(dense == "copy" || dense == "mapped") << dense;
  }
  // The kernel level it ran: the process-wide choice (the test runs under the same environment).
  EXPECT_EQ(j["cpu_isa"].get<std::string>(), kernels::CpuIsaName(kernels::ActiveCpuIsa()));
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["read_bandwidth_gb_per_s"].get<double>(), 0.0);
  const double gbps =
      j["decode_tokens_per_s"].get<double>() * j["decode_bytes_per_token"].get<double>() / 1e9;
  EXPECT_NEAR(j["decode_gb_per_s"].get<double>(), gbps, 1e-9 * gbps + 1e-12);
  // Per decoded token and per prompt: the phases add up to no more than the forward, which is
  // no more than the whole step / prompt the tokens/s figures say.
  // The experts' time: the CPU executor's gate+up phase, or on a GPU its expert kernels' device
  // time.
  const std::string backend = j["backend"].get<std::string>();
  const char* experts_phase = backend == "cpu" ? "experts_gate_up" : "gpu_experts";
  const std::pair<const char*, const char*> profiles[] = {
      {"decode_phase_ms_per_token", "step"}, {"prefill_phase_ms_per_prompt", "prompt"}};
  for (const auto& [key, total] : profiles) {
    ASSERT_TRUE(j.contains(key)) << key;
    const auto& p = j[key];
    double parts = 0;
    for (const char* phase : {"attn_qkv", "attention", "attn_out", "router", "routing",
                              "experts_gate_up", "experts_down", "lm_head"}) {
      ASSERT_TRUE(p.contains(phase)) << key << " " << phase;
      EXPECT_GE(p[phase].get<double>(), 0.0) << key << " " << phase;
      parts += p[phase].get<double>();
    }
    EXPECT_GT(p[experts_phase].get<double>(), 0.0) << key << " " << backend;
    EXPECT_LE(parts, p["forward"].get<double>() * (1 + 1e-9)) << key;
    EXPECT_LE(p["forward"].get<double>(), p[total].get<double>() * 1.05 + 0.05) << key;
  }
}

// bench --temperature/--top-k/--top-p/--min-p: sampled decode runs and the JSON says how the
// tokens were drawn (greedy by default).
TEST(Cli, BenchSamplesWhenAsked) {
  const std::string run = "bench " + Model() +
                          " --prompt-tokens 5 --gen-tokens 4 --repeats 1 --threads 2 --json"
                          " --bandwidth-mib 64";
  const auto greedy = testing::RunCli(run);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  const auto g = nlohmann::json::parse(LastLine(greedy.out));
  EXPECT_EQ(g["sampling"]["temperature"].get<double>(), 0.0);
  const auto sampled =
      testing::RunCli(run + " --temperature 0.7 --top-k 20 --top-p 0.9 --min-p 0.05");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
  const auto j = nlohmann::json::parse(LastLine(sampled.out));
  EXPECT_FLOAT_EQ(j["sampling"]["temperature"].get<float>(), 0.7f);
  EXPECT_EQ(j["sampling"]["top_k"].get<int>(), 20);
  EXPECT_FLOAT_EQ(j["sampling"]["top_p"].get<float>(), 0.9f);
  EXPECT_FLOAT_EQ(j["sampling"]["min_p"].get<float>(), 0.05f);
  EXPECT_GT(j["decode_tokens_per_s"].get<double>(), 0.0);
}

// bench's KV cache is in --kv-dtype (its default the other commands'), and its size follows from
// the run: the flags that size it elsewhere are refused, not ignored.
TEST(Cli, BenchUsesKvDTypeAndRefusesTheKvSizeFlags) {
  const std::string run = "bench " + Model() +
                          " --prompt-tokens 5 --gen-tokens 2 --repeats 1 --threads 2 --json"
                          " --bandwidth-mib 64 --no-gpu";
  uint64_t pool_bytes[2] = {0, 0};
  const char* dtypes[2] = {"f32", "bf16"};
  for (int i = 0; i < 2; ++i) {
    const auto r = testing::RunCli(run + " --kv-dtype " + dtypes[i]);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(LastLine(r.out));
    EXPECT_EQ(j["kv_dtype"].get<std::string>(), dtypes[i]);
    pool_bytes[i] = j["kv_pool_bytes"].get<uint64_t>();
  }
  EXPECT_GT(pool_bytes[1], 0u);
  EXPECT_EQ(pool_bytes[0], 2 * pool_bytes[1]);
  for (const char* flag : {"--ctx-size 64", "--kv-cache-gb 1", "--kv-host-gb 1"}) {
    const auto r = testing::RunCli(run + " " + flag);
    EXPECT_NE(r.exit_code, 0) << flag;
    EXPECT_NE(r.err.find("drop --ctx-size, --kv-cache-gb and --kv-host-gb"), std::string::npos)
        << r.err;
  }
}

}  // namespace
}  // namespace moetier
