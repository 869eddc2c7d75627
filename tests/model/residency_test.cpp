// Issue 4 end to end on the fixtures: the converted format loads to exactly the logits of the
// Hugging Face directory, every residency split gives bit-identical logits, the report tells
// what happened, and a broken conversion is a one-line error naming the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "io/bank_index.h"
#include "model/causal_lm.h"
#include "model/convert.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;

struct ScopedEnv {
  ScopedEnv(const char* k, const char* v) : key(k) { setenv(k, v, 1); }
  ~ScopedEnv() { unsetenv(key); }
  const char* key;
};

class Residency : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    hf_ = testing::HfFixture(GetParam());
    converted_ = tmp_.path() / "converted";
    auto r = ConvertCheckpoint(hf_, converted_, ConvertOptions{});
    ASSERT_TRUE(r.ok()) << r.message();
  }
  std::vector<float> Logits(const fs::path& dir, const ResidencyOptions& opts,
                            ResidencyReport* report = nullptr) {
    LoadOptions load;
    load.n_threads = 2;
    load.residency = opts;
    load.residency.use_gpu = false;  // bit-identical across splits: the CPU engine's promise
    auto m = LoadCausalLM(dir, load);
    EXPECT_TRUE(m.ok()) << m.message();
    if (!m.ok()) return {};
    KvCache cache = *(*m)->NewCache(16);
    std::vector<float> logits;
    const std::vector<int32_t> tokens = {3, 17, 42, 7, 99, 1};
    EXPECT_TRUE((*m)->Forward(tokens, cache, LogitsFor::kAllTokens, logits).ok());
    if (report) *report = (*m)->residency();
    return logits;
  }
  static ResidencyOptions Opts(Backend b, const std::string& cpu_layers = "auto",
                               std::optional<double> lock_gb = std::nullopt,
                               std::optional<double> pin_gb = std::nullopt) {
    ResidencyOptions o;
    o.backend = b;
    o.cpu_layers = cpu_layers;
    o.budgets.lock_budget_gb = lock_gb;
    o.budgets.pin_budget_gb = pin_gb;
    return o;
  }
  testing::TempDir tmp_;
  fs::path hf_, converted_;
};

TEST_P(Residency, ConvertedEqualsHuggingFaceBitForBit) {
  ResidencyReport report;
  const auto a = Logits(hf_, Opts(Backend::kCpu));
  const auto b = Logits(converted_, Opts(Backend::kCpu), &report);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(report.read_mode == "o_direct" || report.read_mode == "buffered") << report.read_mode;
}

TEST_P(Residency, EverySplitGivesIdenticalLogits) {
  const auto want = Logits(hf_, Opts(Backend::kCpu));
  struct Split {
    const char* name;
    ResidencyOptions opts;
    const char* inject;
  };
  const Split splits[] = {
      {"all locked (cpu)", Opts(Backend::kCpu), nullptr},
      {"offload, no cpu layers", Opts(Backend::kOffload, "0"), nullptr},
      {"hybrid, layer 1 on cpu", Opts(Backend::kHybrid, "1,"), nullptr},
      {"offload, count 2", Opts(Backend::kOffload, "2"), nullptr},
      {"offload, fraction 0.5", Opts(Backend::kOffload, "0.5"), nullptr},
      {"tiny lock budget: all pageable", Opts(Backend::kCpu, "auto", 0.0), nullptr},
      {"tiny pin budget", Opts(Backend::kOffload, "auto", std::nullopt, 1e-6), nullptr},
      {"injected pin failures", Opts(Backend::kOffload, "0"), "pin=all"},
      {"injected lock failures", Opts(Backend::kCpu), "lock=0,1"},
      {"injected pin and lock failures", Opts(Backend::kHybrid, "0"), "pin=all;lock=all"},
  };
  for (const auto& s : splits) {
    for (const fs::path& dir : {hf_, converted_}) {
      std::unique_ptr<ScopedEnv> env;
      if (s.inject) env = std::make_unique<ScopedEnv>("MOETIER_INJECT_FAILURES", s.inject);
      ResidencyReport report;
      EXPECT_EQ(Logits(dir, s.opts, &report), want) << s.name << " on " << dir;
      ASSERT_TRUE(report.settled.has_value());
      // Nothing is pinned without a GPU; with one, nothing not planned pinned is.
      for (size_t i = 0; i < report.settled->size(); ++i) {
        if ((*report.settled)[i].tier == Tier::kPinned) {
          EXPECT_EQ(report.plan.layers[i].tier, Tier::kPinned) << s.name;
        }
      }
    }
  }
}

TEST_P(Residency, ReportSaysWhatHappened) {
  ScopedEnv env("MOETIER_INJECT_FAILURES", "lock=1");
  ResidencyReport r;
  Logits(converted_, Opts(Backend::kCpu), &r);
  ASSERT_TRUE(r.settled.has_value());
  const auto j = ResidencyReportJson(r);
  ASSERT_EQ(j["plan"].size(), j["settled"].size());
  uint64_t locked = 0, pageable = 0;
  for (const auto& l : j["settled"]) {
    if (l["tier"] == "locked") locked += l["bytes"].get<uint64_t>();
    if (l["tier"] == "pageable") pageable += l["bytes"].get<uint64_t>();
    EXPECT_EQ(l["tier"] == "pageable", l["layer"] == 1) << l.dump();
  }
  EXPECT_EQ(j["bytes"]["locked"], locked);
  EXPECT_EQ(j["bytes"]["pageable"], pageable);
  EXPECT_EQ(j["bytes"]["pinned"], 0u);
  EXPECT_GT(pageable, 0u);
  if (locked > 0) {
    EXPECT_GE(j["vmlck_bytes"].get<uint64_t>(), locked);
  }
  EXPECT_TRUE(j["pin_budget_bytes"].is_null());
  EXPECT_TRUE(j["lock_budget_bytes"].is_number());
  EXPECT_FALSE(j["warnings"].empty());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Residency, ::testing::Values("qwen3_moe", "mixtral"));

class ConvertedErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path() / "m";
    auto r = ConvertCheckpoint(testing::HfFixture("qwen3_moe"), dir_, ConvertOptions{});
    ASSERT_TRUE(r.ok()) << r.message();
    index_ = nlohmann::json::parse(testing::ReadFile(dir_ / kBankIndexFileName));
  }
  std::string LoadError(bool verify = true) {
    LoadOptions o;
    o.residency.verify = verify;
    auto m = LoadCausalLM(dir_, o);
    if (m.ok()) return "";
    EXPECT_EQ(m.message().find('\n'), std::string::npos);
    return m.message();
  }
  void FlipByteAt(uint64_t offset) {
    const fs::path f = dir_ / "data-00000.bin";
    std::string bytes = testing::ReadFile(f);
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x40);
    testing::WriteFile(f, bytes);
  }
  testing::TempDir tmp_;
  fs::path dir_;
  nlohmann::json index_;
};

TEST_F(ConvertedErrors, DataFileShorterThanIndexSaysHowManyBytesAreMissing) {
  const fs::path f = dir_ / "data-00000.bin";
  const std::string bytes = testing::ReadFile(f);
  testing::WriteFile(f, bytes.substr(0, bytes.size() - 5000));
  const std::string e = LoadError();
  EXPECT_NE(e.find("data-00000.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("(5000 bytes missing)"), std::string::npos) << e;
}

TEST_F(ConvertedErrors, BankChecksumMismatchNamesTheLayerAndFile) {
  FlipByteAt(index_["banks"][2]["offset"].get<uint64_t>() + 777);
  const std::string e = LoadError();
  EXPECT_NE(e.find("data-00000.bin: checksum mismatch in the expert bank of layer 2"),
            std::string::npos)
      << e;
  EXPECT_EQ(LoadError(/*verify=*/false), "");  // --no-verify skips the check
}

TEST_F(ConvertedErrors, DenseChecksumMismatchNamesTheTensor) {
  for (const auto& t : index_["tensors"])
    if (t["name"] == "model.norm.weight") FlipByteAt(t["offset"].get<uint64_t>() + 3);
  const std::string e = LoadError();
  EXPECT_NE(e.find("checksum mismatch in tensor 'model.norm.weight'"), std::string::npos) << e;
}

TEST_F(ConvertedErrors, IndexContradictingConfigIsAnError) {
  auto config = nlohmann::json::parse(testing::ReadFile(dir_ / "config.json"));
  config["moe_intermediate_size"] = 32;
  testing::WriteFile(dir_ / "config.json", config.dump());
  std::string e = LoadError();
  EXPECT_NE(e.find(std::string(kBankIndexFileName) + ": bank of layer 0 has width 48"),
            std::string::npos)
      << e;

  config["moe_intermediate_size"] = 48;
  config["mlp_only_layers"] = {1};
  config["intermediate_size"] = 128;
  testing::WriteFile(dir_ / "config.json", config.dump());
  e = LoadError();
  EXPECT_NE(e.find("4 expert banks but"), std::string::npos) << e;
}

TEST_F(ConvertedErrors, MalformedIndexIsAnErrorNamingIt) {
  testing::WriteFile(dir_ / kBankIndexFileName, "{\"format\": \"moetier-bank\", ");
  EXPECT_NE(LoadError().find("moetier-index.json: not valid JSON"), std::string::npos);
  index_["banks"][1]["offset"] = index_["banks"][0]["offset"];
  testing::WriteFile(dir_ / kBankIndexFileName, index_.dump());
  EXPECT_NE(LoadError().find("overlap"), std::string::npos) << LoadError();
}

TEST_F(ConvertedErrors, ConvertRefusesANonEmptyOutputAndItsOwnInput) {
  auto again = ConvertCheckpoint(testing::HfFixture("qwen3_moe"), dir_, ConvertOptions{});
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.message().find("not empty"), std::string::npos);
  ConvertOptions overwrite;
  overwrite.overwrite = true;
  EXPECT_TRUE(ConvertCheckpoint(testing::HfFixture("qwen3_moe"), dir_, overwrite).ok());
  // A converted model converts again (ConvertFromConverted tests), but never onto itself.
  auto onto_itself = ConvertCheckpoint(dir_, dir_, overwrite);
  ASSERT_FALSE(onto_itself.ok());
  EXPECT_NE(onto_itself.message().find("--out must differ from --model"), std::string::npos)
      << onto_itself.message();
  EXPECT_TRUE(LoadCausalLM(dir_, testing::WithThreads(1)).ok()) << "the source must survive";
}

TEST_F(ConvertedErrors, ShardedConversionLoadsTheSame) {
  ConvertOptions small;
  small.shard_bytes = 100000;  // forces several data files
  const fs::path sharded = tmp_.path() / "sharded";
  auto r = ConvertCheckpoint(testing::HfFixture("qwen3_moe"), sharded, small);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_GT(r->n_files, 2);
  for (const fs::path& d : {dir_, sharded}) {
    auto m = LoadCausalLM(d, LoadOptions{});
    ASSERT_TRUE(m.ok()) << m.message();
  }
}

}  // namespace
}  // namespace moetier
