// Every way a checkpoint directory can be broken: each test builds its broken
// copy of the qwen3_moe fixture and expects one clear error naming the file, never a crash or a
// silent load. Also: a sharded checkpoint loads and computes what the single file does.
#include <gtest/gtest.h>

#include <sys/stat.h>

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

// A header length a few bytes short of the real one (its JSON still parses: headers are
// space-padded) would read every tensor shifted; the data-coverage rule refuses it.
TEST_F(LoadErrors, HeaderLengthAFewBytesShort) {
  const std::string file = testing::ReadFile(weights());
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i)
    len = (len << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  const std::string header = file.substr(8, len);
  const std::string data = file.substr(8 + len);
  // Pad the header as writers do, then claim 3 bytes fewer: still valid JSON.
  testing::WriteRawSafetensors(weights(), header.size() + 5, header + "        ", data);
  ExpectLoadError({"model.safetensors", "belong to no tensor"});
}

// A FIFO (nobody writing) as the weights or the config is refused at once, not waited on.
TEST_F(LoadErrors, FifoInsteadOfAFileIsRefusedWithoutBlocking) {
  for (const char* name : {"model.safetensors", "config.json"}) {
    fs::remove_all(dir_);
    testing::CopyDir(testing::HfFixture("qwen3_moe"), dir_);
    fs::remove(dir_ / name);
    ASSERT_EQ(::mkfifo((dir_ / name).c_str(), 0600), 0);
    ExpectLoadError({name, "not a regular file"});
  }
}

// A symbolic-link loop as the model directory or as one of its files is an error naming it.
TEST_F(LoadErrors, SymlinkLoopsAreErrors) {
  const fs::path loop = tmp_.path() / "loop";
  fs::create_symlink(loop, loop);
  auto m = LoadCausalLM(loop, testing::WithThreads(1));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("loop"), std::string::npos) << m.message();
  for (const char* name : {"model.safetensors", "config.json", "model.safetensors.index.json"}) {
    fs::remove_all(dir_);
    testing::CopyDir(testing::HfFixture("qwen3_moe"), dir_);
    fs::remove(dir_ / name);
    fs::create_symlink(dir_ / name, dir_ / name);
    ExpectLoadError({name});
  }
}

// NaN weights make the forward fail with an error naming the layer where the residual stream
// first became non-finite, instead of logits that crash or fool the sampler.
TEST_F(LoadErrors, NonFiniteActivationsNameTheLayer) {
  auto tensors = testing::ReadSafetensors(weights());
  TensorSpec& o = tensors.at("model.layers.2.self_attn.o_proj.weight");
  ASSERT_TRUE(o.dtype == "BF16" || o.dtype == "F32") << o.dtype;
  const std::string nan =
      o.dtype == "BF16" ? std::string("\xc0\x7f", 2) : std::string("\x00\x00\xc0\x7f", 4);
  for (size_t i = 0; i + nan.size() <= o.bytes.size(); i += nan.size())
    o.bytes.replace(i, nan.size(), nan);
  testing::WriteSafetensors(weights(), tensors);
  auto m = LoadCausalLM(dir_, testing::WithThreads(1));
  ASSERT_TRUE(m.ok()) << m.message();
  KvCache cache = *(*m)->NewCache(8);
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 2, 3};
  Status s = (*m)->Forward(tokens, cache, LogitsFor::kLastToken, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 2 produced a non-finite value"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("config.json"), std::string::npos) << s.message();
}

// A NaN in the final norm reaches only the logits: Forward, ForwardArgMax and ForwardTopK (which
// never hand the logits back), the last with its row's token drawn on the device too, all fail
// naming the lm_head.
TEST_F(LoadErrors, NonFiniteLogitsNameTheLmHead) {
  auto tensors = testing::ReadSafetensors(weights());
  TensorSpec& norm = tensors.at("model.norm.weight");
  ASSERT_TRUE(norm.dtype == "BF16" || norm.dtype == "F32") << norm.dtype;
  const std::string nan =
      norm.dtype == "BF16" ? std::string("\xc0\x7f", 2) : std::string("\x00\x00\xc0\x7f", 4);
  norm.bytes.replace(0, nan.size(), nan);
  testing::WriteSafetensors(weights(), tensors);
  auto m = LoadCausalLM(dir_, testing::WithThreads(1));
  ASSERT_TRUE(m.ok()) << m.message();
  auto pool = (*m)->NewKvPool(4, 16, DType::kF32);
  ASSERT_TRUE(pool.ok()) << pool.message();
  const std::vector<int32_t> table = {0};
  const std::vector<std::span<const int32_t>> tables = {table};
  const std::vector<int32_t> tokens = {1, 2, 3}, positions = {0, 1, 2}, seq_of = {0, 0, 0};
  const std::vector<int32_t> last = {2};
  const Batch batch{tokens, positions, seq_of, tables, last};
  Batch drawn = batch;
  RowDraw draw;
  draw.u = 0.5;
  drawn.draws = std::span(&draw, 1);
  std::vector<float> logits;
  std::vector<int32_t> ids;
  TopKRows top;
  for (const Status& s :
       {(*m)->Forward(batch, *pool, logits), (*m)->ForwardArgMax(batch, *pool, ids),
        (*m)->ForwardTopK(batch, *pool, top), (*m)->ForwardTopK(drawn, *pool, top)}) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("the lm_head produced a non-finite value"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("at position 2;"), std::string::npos) << s.message();
  }
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
  KvCache c1 = *(*sharded)->NewCache(8), c2 = *(*single)->NewCache(8);
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
  KvCache cache = *(*m)->NewCache(8);
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 512};
  Status s = (*m)->Forward(tokens, cache, LogitsFor::kLastToken, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token id 512"), std::string::npos);
}

TEST_F(LoadErrors, ContextOverflowIsAnError) {
  auto m = LoadCausalLM(dir_, testing::WithThreads(1));
  ASSERT_TRUE(m.ok());
  KvCache cache = *(*m)->NewCache(2);
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 2, 3};
  Status s = (*m)->Forward(tokens, cache, LogitsFor::kLastToken, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--ctx-size"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace moetier
