// moetier convert never leaves garbage and refuses what the loader refuses: a checkpoint that
// disagrees with config.json (a shape, a missing tensor, a dtype, a tensor config.json does not
// account for) is an error naming the tensor before anything is written; a bad --out or --model
// (a symlink loop, a file, a FIFO, a path through a file, one inside the other) is a one-line
// error naming it, before any weight is read; and a conversion that fails once it has started
// writing (an unpackable row, a damaged converted source, a write error, an interruption) leaves
// --out exactly as it was, with no temporary directory beside or inside it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/bank_index.h"
#include "model/causal_lm.h"
#include "model/convert.h"
#include "model/model_source.h"
#include "support/test_support.h"

namespace moetier {
namespace {

namespace fs = std::filesystem;
using testing::TensorSpec;

ConvertOptions Opts(DType experts = DType::kBF16) {
  ConvertOptions o;
  o.expert_dtype = experts;
  o.n_threads = 2;
  return o;
}

// Whether `p` exists as anything, a dangling or looping symlink included.
bool Exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

// The entry names of directory `dir`, sorted; empty when it is not a readable directory.
std::vector<std::string> Entries(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// No staging directory of a conversion into `out` is left, beside it or inside it.
void ExpectNoStaging(const fs::path& out) {
  const std::string beside = out.filename().string() + ".tmp-";
  for (const std::string& name : Entries(out.parent_path()))
    EXPECT_NE(name.rfind(beside, 0), 0u) << "left behind: " << (out.parent_path() / name);
  for (const std::string& name : Entries(out))
    EXPECT_EQ(name.find(".moetier-convert.tmp-"), std::string::npos)
        << "left behind: " << (out / name);
}

void ExpectOneLineWith(const std::string& message, const std::vector<std::string>& needles) {
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  for (const std::string& n : needles)
    EXPECT_NE(message.find(n), std::string::npos) << "missing '" << n << "' in: " << message;
}

// BF16 tensor `t` as F32: the same values in another dtype.
TensorSpec AsF32(const TensorSpec& t) {
  TensorSpec f{"F32", t.shape, std::string(t.bytes.size() * 2, '\0')};
  for (size_t i = 0; i < t.bytes.size() / 2; ++i) {
    uint16_t h;
    std::memcpy(&h, t.bytes.data() + 2 * i, 2);
    const float v = Bf16ToF32(h);
    std::memcpy(f.bytes.data() + 4 * i, &v, 4);
  }
  return f;
}

class ConvertErrors : public ::testing::Test {
 protected:
  void UseFixture(const std::string& rel) {
    fs::remove_all(hf_);
    testing::CopyDir(testing::HfFixture(rel), hf_);
    tensors_ = testing::ReadSafetensors(weights());
  }
  void SetUp() override {
    hf_ = tmp_.path() / "hf";
    out_ = tmp_.path() / "out";
    UseFixture("qwen3_moe");
  }
  fs::path weights() const { return hf_ / "model.safetensors"; }
  void WriteTensors() { testing::WriteSafetensors(weights(), tensors_); }

  // Converts and expects a failure whose one-line message contains every needle, with --out
  // (and --model) exactly as before. Returns the message.
  std::string ExpectRefused(const std::vector<std::string>& needles, ConvertOptions o = Opts()) {
    const bool existed = Exists(out_);
    const std::vector<std::string> before = Entries(out_), model_before = Entries(hf_);
    auto r = ConvertCheckpoint(hf_, out_, o);
    EXPECT_FALSE(r.ok()) << "converted what it should refuse";
    if (r.ok()) return "";
    ExpectOneLineWith(r.message(), needles);
    EXPECT_EQ(Exists(out_), existed) << out_;
    EXPECT_EQ(Entries(out_), before) << out_;
    EXPECT_EQ(Entries(hf_), model_before) << hf_;
    ExpectNoStaging(out_);
    return r.message();
  }
  // As ExpectRefused, and the loader refuses the checkpoint with the very same message: the two
  // share each check.
  void ExpectRefusedLikeTheLoader(const std::vector<std::string>& needles) {
    const std::string convert_error = ExpectRefused(needles);
    auto m = LoadCausalLM(hf_, testing::WithThreads(1));
    ASSERT_FALSE(m.ok()) << "the loader accepts what convert refuses";
    EXPECT_EQ(m.message(), convert_error);
  }

  testing::TempDir tmp_;
  fs::path hf_, out_;
  std::map<std::string, TensorSpec> tensors_;
};

// --- Checkpoints the loader refuses -----------------------------------------------------------

TEST_F(ConvertErrors, ShapeThatDisagreesWithConfig) {
  tensors_.at("model.layers.2.self_attn.q_proj.weight").shape = {32, 128};  // [64, 64]
  WriteTensors();
  ExpectRefusedLikeTheLoader({"model.safetensors",
                              "tensor 'model.layers.2.self_attn.q_proj.weight' has shape [32, 128]",
                              "config.json", "[64, 64]"});
}

TEST_F(ConvertErrors, ExpertShapeThatDisagreesWithConfig) {
  tensors_.at("model.layers.1.mlp.experts.3.up_proj.weight").shape = {64, 48};  // [48, 64]
  WriteTensors();
  ExpectRefusedLikeTheLoader(
      {"model.safetensors", "'model.layers.1.mlp.experts.3.up_proj.weight' has shape [64, 48]"});
}

TEST_F(ConvertErrors, MissingDenseTensor) {
  tensors_.erase("model.layers.3.post_attention_layernorm.weight");
  WriteTensors();
  ExpectRefusedLikeTheLoader({"missing tensor 'model.layers.3.post_attention_layernorm.weight'"});
}

TEST_F(ConvertErrors, MissingExpertTensor) {
  tensors_.erase("model.layers.1.mlp.experts.7.down_proj.weight");
  WriteTensors();
  ExpectRefusedLikeTheLoader({"missing tensor 'model.layers.1.mlp.experts.7.down_proj.weight'"});
}

TEST_F(ConvertErrors, DtypeThatDisagreesWithConfig) {
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  tensors_[name] = AsF32(tensors_.at(name));
  WriteTensors();
  ExpectRefusedLikeTheLoader({"'" + name + "' is F32", "declares BF16"});
}

TEST_F(ConvertErrors, ExpertDtypeThatDisagreesWithConfig) {
  const std::string name = "model.layers.2.mlp.experts.5.gate_proj.weight";
  tensors_[name] = AsF32(tensors_.at(name));
  WriteTensors();
  ExpectRefusedLikeTheLoader({"'" + name + "' is F32", "declares BF16"});
}

TEST_F(ConvertErrors, DtypeThatIsNoWeight) {
  const std::string name = "model.norm.weight";
  tensors_[name] = TensorSpec{"I16", {64}, std::string(128, '\0')};
  WriteTensors();
  ExpectRefusedLikeTheLoader({"'" + name + "' has dtype I16", "weights must be"});
}

// --- Tensors config.json does not account for --------------------------------------------------

TEST_F(ConvertErrors, ExpertPastTheConfigsCount) {
  tensors_["model.layers.0.mlp.experts.8.gate_proj.weight"] =
      tensors_.at("model.layers.0.mlp.experts.0.gate_proj.weight");
  WriteTensors();
  ExpectRefused({"model.safetensors", "tensor 'model.layers.0.mlp.experts.8.gate_proj.weight'",
                 "not part of", "8 experts", "fix config.json"});
}

TEST_F(ConvertErrors, LayerPastTheConfigsCount) {
  tensors_["model.layers.4.input_layernorm.weight"] =
      tensors_.at("model.layers.3.input_layernorm.weight");
  WriteTensors();
  ExpectRefused({"tensor 'model.layers.4.input_layernorm.weight'", "4 layers"});
}

TEST_F(ConvertErrors, UnknownTensor) {
  tensors_["model.visual.proj.weight"] = tensors_.at("model.norm.weight");
  WriteTensors();
  ExpectRefused({"tensor 'model.visual.proj.weight'", "not part of the Qwen3MoeForCausalLM"});
}

// Tied embeddings read the embedding table as the lm_head: a separate lm_head.weight would be
// ignored, so a config that ties them does not describe this checkpoint.
TEST_F(ConvertErrors, LmHeadBesideTiedEmbeddings) {
  UseFixture("realvocab/qwen3_moe_tiny");
  tensors_["lm_head.weight"] = tensors_.at("model.embed_tokens.weight");
  WriteTensors();
  ExpectRefused({"tensor 'lm_head.weight'", "not part of"});
}

// A rotary embedding's inv_freq buffer is recomputed from config.json: dropped with a warning
// naming it, and the conversion loads.
TEST_F(ConvertErrors, RotaryInvFreqIsDroppedWithAWarning) {
  const std::string name = "model.layers.1.self_attn.rotary_emb.inv_freq";
  tensors_[name] = TensorSpec{"F32", {8}, std::string(32, '\0')};
  WriteTensors();
  auto r = testing::RunCli("convert -m '" + hf_.string() + "' -o '" + out_.string() + "' -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("'" + name + "'"), std::string::npos) << r.err;
  const std::string index = testing::ReadFile(out_ / kBankIndexFileName);
  EXPECT_EQ(index.find("inv_freq"), std::string::npos);
  EXPECT_TRUE(LoadCausalLM(out_, testing::WithThreads(1)).ok());
}

// --- --out and --model ----------------------------------------------------------------------

TEST_F(ConvertErrors, OutIsASymlinkLoop) {
  out_ = tmp_.path() / "loop";
  fs::create_symlink("loop", out_);
  ExpectRefused({"--out " + out_.string(), "Too many levels of symbolic links"});
  EXPECT_TRUE(fs::is_symlink(out_));
}

TEST_F(ConvertErrors, ModelIsASymlinkLoop) {
  hf_ = tmp_.path() / "loop";
  fs::create_symlink("loop", hf_);
  ExpectRefused({hf_.string(), "Too many levels of symbolic links", "--model"});
}

TEST_F(ConvertErrors, OutIsARegularFile) {
  testing::WriteFile(out_, "notes");
  ExpectRefused({"--out " + out_.string(), "exists and is not a directory"});
  EXPECT_EQ(testing::ReadFile(out_), "notes");
}

TEST_F(ConvertErrors, OutUnderARegularFile) {
  testing::WriteFile(tmp_.path() / "file", "notes");
  out_ = tmp_.path() / "file" / "x";
  ExpectRefused(
      {"--out " + out_.string(), (tmp_.path() / "file").string() + " is not a directory"});
}

TEST_F(ConvertErrors, OutIsAFifo) {
  ASSERT_EQ(::mkfifo(out_.c_str(), 0644), 0);
  ExpectRefused({"--out " + out_.string(), "exists and is not a directory"});
  EXPECT_TRUE(fs::is_fifo(out_));
}

TEST_F(ConvertErrors, OutIsADanglingSymlink) {
  fs::create_symlink(tmp_.path() / "nowhere", out_);
  ExpectRefused({"--out " + out_.string(), "symbolic link to a path that does not exist"});
}

TEST_F(ConvertErrors, OutInsideTheModel) {
  out_ = hf_ / "converted";
  ExpectRefused({"--out " + out_.string(), "inside --model"});
}

TEST_F(ConvertErrors, OutHoldingTheModelIsNeverReplaced) {
  ASSERT_TRUE(ConvertCheckpoint(hf_, out_, Opts()).ok());
  const fs::path inner = out_ / "hf";
  testing::CopyDir(hf_, inner);
  hf_ = inner;
  ConvertOptions o = Opts();
  o.overwrite = true;
  ExpectRefused({"--out " + out_.string(), "holds --model"}, o);
}

TEST_F(ConvertErrors, OutHoldingSomethingElse) {
  fs::create_directory(out_);
  testing::WriteFile(out_ / "notes.txt", "mine");
  ExpectRefused({"--out " + out_.string(), "not empty"});
  ConvertOptions o = Opts();
  o.overwrite = true;  // replaces only an earlier conversion
  ExpectRefused({"--out " + out_.string(), "not an earlier conversion"}, o);
}

TEST_F(ConvertErrors, EarlierConversionNeedsOverwrite) {
  ASSERT_TRUE(ConvertCheckpoint(hf_, out_, Opts()).ok());
  ExpectRefused({"--out " + out_.string(), "not empty", "--overwrite"});
}

TEST_F(ConvertErrors, UnwritableOut) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes through permissions (OutUnderARegularFile)";
  const fs::path ro = tmp_.path() / "ro";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  out_ = ro / "out";
  ExpectRefused({"--out " + out_.string(), "cannot create", "Permission denied"});
  fs::permissions(ro, fs::perms::owner_all);
}

// --- Failures once writing has started: --out is left as it was ------------------------------

class ConvertFailures : public ConvertErrors {
 protected:
  // qwen3_moe_tiny (rows of 32, which bf16c needs) with one expert row bf16c cannot hold:
  // a bf16c conversion fails in layer 1's bank, after layer 0's was written.
  void SetUp() override {
    ConvertErrors::SetUp();
    UseFixture("realvocab/qwen3_moe_tiny");
    TensorSpec& t = tensors_.at("model.layers.1.mlp.experts.2.up_proj.weight");
    testing::WriteUnpackableRow(t.bytes.data() + 3 * 2 * t.shape[1], t.shape[1]);
    WriteTensors();
  }
  const std::vector<std::string> kUnpackable = {
      "'model.layers.1.mlp.experts.2.up_proj.weight' row 3", "--dtype bf16"};
};

TEST_F(ConvertFailures, NewOutIsNotCreated) {
  ExpectRefused(kUnpackable, Opts(DType::kBF16C));
}

TEST_F(ConvertFailures, MissingParentsAreNotLeft) {
  out_ = tmp_.path() / "a" / "b" / "out";
  ExpectRefused(kUnpackable, Opts(DType::kBF16C));
  EXPECT_FALSE(Exists(tmp_.path() / "a"));
}

TEST_F(ConvertFailures, EmptyOutStaysEmpty) {
  fs::create_directory(out_);
  ExpectRefused(kUnpackable, Opts(DType::kBF16C));
  EXPECT_TRUE(fs::is_directory(out_));
}

TEST_F(ConvertFailures, EarlierConversionSurvivesAFailedOverwrite) {
  ASSERT_TRUE(ConvertCheckpoint(hf_, out_, Opts()).ok());
  const std::string index = testing::ReadFile(out_ / kBankIndexFileName);
  ConvertOptions o = Opts(DType::kBF16C);
  o.overwrite = true;
  ExpectRefused(kUnpackable, o);
  EXPECT_EQ(testing::ReadFile(out_ / kBankIndexFileName), index);
  EXPECT_TRUE(LoadCausalLM(out_, testing::WithThreads(1)).ok());
}

TEST_F(ConvertFailures, Interruption) {
  std::atomic<bool> cancel{true};
  ConvertOptions o = Opts();
  o.cancel = &cancel;
  ExpectRefused({"interrupted"}, o);
}

// The file-size limit makes the first data file's write fail (EFBIG), as a full disk would.
TEST_F(ConvertFailures, WriteError) {
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 256 << 10;  // the output is ~10 MB
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old_action);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto r = ConvertCheckpoint(hf_, out_, Opts());
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  ASSERT_FALSE(r.ok());
  ExpectOneLineWith(r.message(), {"data-00000.bin", "write failed", "File too large"});
  EXPECT_FALSE(Exists(out_));
  ExpectNoStaging(out_);
}

TEST_F(ConvertFailures, DamagedConvertedSource) {
  const fs::path src = tmp_.path() / "bf16";
  ASSERT_TRUE(ConvertCheckpoint(testing::HfFixture("qwen3_moe"), src, Opts()).ok());
  const BankIndex idx = *ParseBankIndex(testing::ReadFile(src / kBankIndexFileName), "index");
  const BankIndexBank& last = idx.banks.back();
  const fs::path data = src / idx.files[last.file].name;
  std::string bytes = testing::ReadFile(data);
  bytes[last.offset + last.bytes / 2] ^= 0x40;
  testing::WriteFile(data, bytes);
  hf_ = src;
  ExpectRefused({idx.files[last.file].name, "layer " + std::to_string(last.layer), "checksum"});
}

// A symlink loop inside --model, where a converted model's index would be, throws nothing: the
// directory converts as a Hugging Face checkpoint, or fails on one line leaving nothing.
TEST_F(ConvertErrors, SymlinkLoopInsideTheModelThrowsNothing) {
  fs::create_symlink(kBankIndexFileName, hf_ / kBankIndexFileName);
  Expected<ConvertSummary> r = Status::Error("not run");
  EXPECT_NO_THROW(r = ConvertCheckpoint(hf_, out_, Opts()));
  if (!r.ok()) {
    ExpectOneLineWith(r.message(), {});
    EXPECT_FALSE(Exists(out_));
  }
  ExpectNoStaging(out_);
}

// --- What works ---------------------------------------------------------------------------

TEST_F(ConvertErrors, ConvertsIntoAnEmptyDirectoryAndThroughASymlink) {
  fs::create_directory(out_);
  ASSERT_TRUE(ConvertCheckpoint(hf_, out_, Opts()).ok());
  ExpectNoStaging(out_);
  EXPECT_TRUE(LoadCausalLM(out_, testing::WithThreads(1)).ok());

  const fs::path target = tmp_.path() / "target", link = tmp_.path() / "link";
  fs::create_directory(target);
  fs::create_symlink(target, link);
  ASSERT_TRUE(ConvertCheckpoint(hf_, link, Opts()).ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::exists(target / kBankIndexFileName));
  ExpectNoStaging(target);

  const fs::path nested = tmp_.path() / "a" / "b" / "c";
  ASSERT_TRUE(ConvertCheckpoint(hf_, nested, Opts()).ok());
  EXPECT_TRUE(fs::exists(nested / kBankIndexFileName));
}

TEST_F(ConvertErrors, OverwriteReplacesTheWholeEarlierConversion) {
  ConvertOptions sharded = Opts();
  sharded.shard_bytes = 100000;  // several data files, more than the next conversion writes
  ASSERT_TRUE(ConvertCheckpoint(hf_, out_, sharded).ok());
  testing::WriteFile(out_ / "stale.txt", "from before");
  ConvertOptions o = Opts();
  o.overwrite = true;
  auto r = ConvertCheckpoint(hf_, out_, o);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->n_files, 1);
  EXPECT_EQ(Entries(out_),
            (std::vector<std::string>{"config.json", "data-00000.bin", "generation_config.json",
                                      kBankIndexFileName}));
  EXPECT_TRUE(LoadCausalLM(out_, testing::WithThreads(1)).ok());
}

// --- The CLI: one line on stderr, a non-zero exit, nothing created ---------------------------

TEST_F(ConvertErrors, CliReportsPathErrorsOnOneLine) {
  const fs::path loop = tmp_.path() / "loop";
  fs::create_symlink("loop", loop);
  for (const auto& [model, out] : {std::pair{loop, out_}, std::pair{hf_, loop}}) {
    auto r = testing::RunCli("convert --model '" + model.string() + "' --out '" + out.string() +
                             "' -t 2");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.back(), '\n');
    ExpectOneLineWith(r.err.substr(0, r.err.size() - 1),
                      {loop.string(), "Too many levels of symbolic links"});
  }
  EXPECT_FALSE(Exists(out_));
  ExpectNoStaging(out_);
}

}  // namespace
}  // namespace moetier
