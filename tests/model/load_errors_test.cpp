// Every way a checkpoint directory can be broken that issue 2 names: each test builds its broken
// copy of the qwen3_moe fixture and expects one clear error naming the file, never a crash or a
// silent load. Also: a sharded checkpoint loads and computes what the single file does.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/causal_lm.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;
using testing::TensorSpec;

class LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path() / "model";
    testing::CopyDir(testing::HfFixture("qwen3_moe"), dir_);
  }
  fs::path weights() const { return dir_ / "model.safetensors"; }
  nlohmann::json Config() const {
    return nlohmann::json::parse(testing::ReadFile(dir_ / "config.json"));
  }
  void SetConfig(const nlohmann::json& j) { testing::WriteFile(dir_ / "config.json", j.dump(2)); }
  // Loads and expects a failure whose message contains every needle.
  void ExpectLoadError(std::initializer_list<std::string> needles) {
    auto m = LoadCausalLM(dir_, testing::WithThreads(1));
    ASSERT_FALSE(m.ok()) << "loaded a broken model";
    EXPECT_EQ(m.message().find('\n'), std::string::npos) << "not one line: " << m.message();
    for (const auto& n : needles)
      EXPECT_NE(m.message().find(n), std::string::npos)
          << "missing '" << n << "' in: " << m.message();
  }

  testing::TempDir tmp_;
  fs::path dir_;
};

TEST_F(LoadErrors, HeaderLengthPastEndOfFile) {
  testing::WriteRawSafetensors(weights(), 1u << 30, "{}", "");
  ExpectLoadError({"model.safetensors", "header length 1073741824 runs past the end"});
}

TEST_F(LoadErrors, FileShorterThanHeaderLength) {
  testing::WriteFile(weights(), "abc");
  ExpectLoadError({"model.safetensors", "shorter than the 8-byte header length"});
}

TEST_F(LoadErrors, HeaderIsNotJson) {
  const std::string h = "{\"a\": {\"dtype\": \"F32\", ";
  testing::WriteRawSafetensors(weights(), h.size(), h, "");
  ExpectLoadError({"model.safetensors", "not valid JSON"});
}

TEST_F(LoadErrors, OverlappingTensors) {
  const std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                        R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})";
  testing::WriteRawSafetensors(weights(), h.size(), h, std::string(24, '\0'));
  ExpectLoadError({"model.safetensors", "'a' and 'b' overlap"});
}

TEST_F(LoadErrors, TruncatedFile) {
  const std::string full = testing::ReadFile(weights());
  testing::WriteFile(weights(), full.substr(0, full.size() - 100));
  ExpectLoadError({"model.safetensors", "truncated"});
}

TEST_F(LoadErrors, ShapeDisagreesWithByteRange) {
  const std::string h = R"({"a":{"dtype":"BF16","shape":[4,4],"data_offsets":[0,16]}})";
  testing::WriteRawSafetensors(weights(), h.size(), h, std::string(16, '\0'));
  ExpectLoadError({"model.safetensors", "tensor 'a'", "needs 32 bytes", "span 16"});
}

TEST_F(LoadErrors, UnknownDtypeName) {
  const std::string h = R"({"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}})";
  testing::WriteRawSafetensors(weights(), h.size(), h, std::string(1, '\0'));
  ExpectLoadError({"model.safetensors", "unknown dtype 'Q9'"});
}

TEST_F(LoadErrors, DtypeContradictsConfig) {
  nlohmann::json j = Config();
  j["torch_dtype"] = "float16";
  SetConfig(j);
  ExpectLoadError({"model.safetensors", "is BF16", "declares F16"});
}

TEST_F(LoadErrors, NonFloatWeight) {
  auto tensors = testing::ReadSafetensors(weights());
  auto& t = tensors["model.norm.weight"];  // [64] bf16 → [64] i16, same bytes
  t.dtype = "I16";
  testing::WriteSafetensors(weights(), tensors);
  ExpectLoadError({"model.safetensors", "'model.norm.weight'", "dtype I16"});
}

TEST_F(LoadErrors, ShapeContradictsConfig) {
  nlohmann::json j = Config();
  j["moe_intermediate_size"] = 40;
  SetConfig(j);
  ExpectLoadError({"model.safetensors", "gate_proj.weight", "[48, 64]", "implies [40, 64]"});
}

TEST_F(LoadErrors, MissingTensor) {
  auto tensors = testing::ReadSafetensors(weights());
  tensors.erase("model.layers.2.mlp.experts.5.down_proj.weight");
  testing::WriteSafetensors(weights(), tensors);
  ExpectLoadError(
      {"model.safetensors", "missing tensor 'model.layers.2.mlp.experts.5.down_proj.weight'"});
}

TEST_F(LoadErrors, UnknownArchitecture) {
  nlohmann::json j = Config();
  j["architectures"] = {"FrobnicatorForCausalLM"};
  SetConfig(j);
  ExpectLoadError(
      {"config.json", "unknown architecture 'FrobnicatorForCausalLM'", "Qwen3MoeForCausalLM"});
}

TEST_F(LoadErrors, ConfigIsNotJson) {
  testing::WriteFile(dir_ / "config.json", "{ \"architectures\": [");
  ExpectLoadError({"config.json", "not valid JSON"});
}

TEST_F(LoadErrors, NoWeights) {
  fs::remove(weights());
  ExpectLoadError({"no model.safetensors or model.safetensors.index.json"});
}

TEST_F(LoadErrors, NotADirectory) {
  dir_ = dir_ / "config.json";
  ExpectLoadError({"config.json", "not a directory"});
}

// Splits the fixture into two shards with an index, as `save_pretrained` does for big models.
void Shard(const fs::path& dir) {
  auto tensors = testing::ReadSafetensors(dir / "model.safetensors");
  std::map<std::string, TensorSpec> a, b;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  bool first = true;
  for (auto& [name, t] : tensors) {
    const char* shard =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    (first ? a : b)[name] = t;
    index["weight_map"][name] = shard;
    first = !first;
  }
  testing::WriteSafetensors(dir / "model-00001-of-00002.safetensors", a);
  testing::WriteSafetensors(dir / "model-00002-of-00002.safetensors", b);
  testing::WriteFile(dir / "model.safetensors.index.json", index.dump(2));
  fs::remove(dir / "model.safetensors");
}

TEST_F(LoadErrors, ShardedCheckpointMatchesSingleFile) {
  Shard(dir_);
  auto sharded = LoadCausalLM(dir_, testing::WithThreads(1));
  ASSERT_TRUE(sharded.ok()) << sharded.message();
  auto single = LoadCausalLM(testing::HfFixture("qwen3_moe"), testing::WithThreads(1));
  ASSERT_TRUE(single.ok()) << single.message();
  const std::vector<int32_t> tokens = {3, 17, 42, 7};
  std::vector<float> x, y;
  KvCache c1 = (*sharded)->NewCache(8), c2 = (*single)->NewCache(8);
  ASSERT_TRUE((*sharded)->Forward(tokens, c1, LogitsFor::kAllTokens, x).ok());
  ASSERT_TRUE((*single)->Forward(tokens, c2, LogitsFor::kAllTokens, y).ok());
  EXPECT_EQ(x, y);
}

TEST_F(LoadErrors, IndexNamesMissingShard) {
  Shard(dir_);
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  ExpectLoadError({"model-00002-of-00002.safetensors", "cannot open"});
}

TEST_F(LoadErrors, IndexNamesTensorAbsentFromShard) {
  Shard(dir_);
  auto index = nlohmann::json::parse(testing::ReadFile(dir_ / "model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] =
      index["weight_map"]["model.norm.weight"] == "model-00001-of-00002.safetensors"
          ? "model-00002-of-00002.safetensors"
          : "model-00001-of-00002.safetensors";
  testing::WriteFile(dir_ / "model.safetensors.index.json", index.dump());
  ExpectLoadError({"tensor 'model.norm.weight' is missing", "model.safetensors.index.json"});
}

TEST_F(LoadErrors, IndexEscapingTheDirectoryIsRejected) {
  testing::WriteFile(dir_ / "model.safetensors.index.json",
                     R"({"weight_map": {"model.norm.weight": "../../etc/passwd"}})");
  ExpectLoadError({"model.safetensors.index.json", "not a file name in this directory"});
}

TEST_F(LoadErrors, OutOfVocabularyTokenIsAnErrorNotACrash) {
  auto m = LoadCausalLM(dir_, testing::WithThreads(1));
  ASSERT_TRUE(m.ok());
  KvCache cache = (*m)->NewCache(8);
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 512};
  Status s = (*m)->Forward(tokens, cache, LogitsFor::kLastToken, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token id 512"), std::string::npos);
}

TEST_F(LoadErrors, ContextOverflowIsAnError) {
  auto m = LoadCausalLM(dir_, testing::WithThreads(1));
  ASSERT_TRUE(m.ok());
  KvCache cache = (*m)->NewCache(2);
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 2, 3};
  Status s = (*m)->Forward(tokens, cache, LogitsFor::kLastToken, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--ctx-size"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moetier
