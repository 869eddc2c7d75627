#include "support/test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/generate.h"
#include "io/safetensors.h"
#include "kernels/cpu/bf16c.h"
#include "model/model_source.h"

namespace moetier::testing {

namespace fs = std::filesystem;

uint64_t OneLayerOfExperts(const fs::path& dir) {
  auto s = OpenModelSource(dir);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return 0;
  const ModelConfig& c = s->config;
  const auto expert = static_cast<uint64_t>(3 * c.expert_intermediate_size * c.hidden_size * 2);
  return (expert + 255) / 256 * 256 * static_cast<uint64_t>(c.n_experts);
}

std::vector<int32_t> IntsOf(const TensorView& t) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t.NumElements(); ++i)
    out.push_back(static_cast<int32_t>(t.as<int64_t>()[i]));
  return out;
}

void ExpectGreedyLikeReference(CausalLM& model, const SafetensorsFile& reference) {
  for (int p = 0; p < 3; ++p) {
    const std::string key = "prompt" + std::to_string(p);
    const TensorView* tokens = reference.Find(key + ".tokens");
    const TensorView* want_view = reference.Find(key + ".greedy");
    const TensorView* margin_view = reference.Find(key + ".greedy_margin");
    ASSERT_TRUE(tokens != nullptr && want_view != nullptr && margin_view != nullptr) << key;
    const std::vector<int32_t> want = IntsOf(*want_view);
    const std::vector<float> margin = ToF32(*margin_view);
    GenerateOptions g;
    g.max_new_tokens = static_cast<int64_t>(want.size());
    auto engine = MakeEngine(model, 64);
    auto got = Generate(*engine, IntsOf(*tokens), g);
    ASSERT_TRUE(got.ok()) << got.message();
    ASSERT_EQ(got->ids.size(), want.size());
    size_t compared = 0;
    for (size_t i = 0; i < want.size() && margin[i] >= 1e-3f; ++i, ++compared)
      ASSERT_EQ(got->ids[i], want[i]) << key << " step " << i;
    EXPECT_GT(compared, 0u) << key;
  }
}

LoadOptions WithThreads(int n) {
  LoadOptions o;
  o.n_threads = n;
  o.residency.use_gpu = false;
  return o;
}

std::unique_ptr<Engine> MakeEngine(CausalLM& model, int64_t kv_positions,
                                   const text::Tokenizer* tokenizer, int parallel) {
  EngineOptions o;
  o.kv_positions = kv_positions;
  o.max_running = parallel;
  auto e = Engine::Create(model, tokenizer, o);
  if (!e.ok()) throw std::runtime_error(e.message());
  return std::move(e).value();
}

fs::path FixturesDir() {
  return fs::path(MOETIER_FIXTURES_DIR);
}
void ForEachThreeSequenceStep(
    int64_t block_size, int64_t n_steps,
    const std::function<void(const Batch&, bool decoding, const std::string& label)>& step) {
  const std::vector<int32_t> lengths = {20, 7, 250};
  std::vector<std::vector<int32_t>> tables(lengths.size());
  for (size_t s = 0, next = 0; s < lengths.size(); ++s)
    for (int64_t b = 0; b * block_size < lengths[s] + n_steps; ++b)
      tables[s].push_back(static_cast<int32_t>(next++));
  const std::vector<std::span<const int32_t>> spans(tables.begin(), tables.end());
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<int32_t> tokens, positions, seq_of;
    for (int32_t p = 0; p < lengths[s]; ++p) {
      tokens.push_back((p * 37 + 11 * static_cast<int32_t>(s) + 5) % 200);
      positions.push_back(p);
      seq_of.push_back(static_cast<int32_t>(s));
    }
    const std::vector<int32_t> last = {lengths[s] - 1};
    step(Batch{tokens, positions, seq_of, spans, last}, false, "prompt " + std::to_string(s));
  }
  const std::vector<int32_t> seq_of = {0, 1, 2};
  for (int32_t i = 0; i < n_steps; ++i) {
    std::vector<int32_t> tokens, positions;
    for (size_t s = 0; s < lengths.size(); ++s) {
      tokens.push_back((i * 53 + 7 * static_cast<int32_t>(s) + 3) % 200);
      positions.push_back(lengths[s] + static_cast<int32_t>(i));
    }
    step(Batch{tokens, positions, seq_of, spans, seq_of}, true, "step " + std::to_string(i));
  }
}

fs::path HfFixture(const std::string& rel) {
  return FixturesDir() / "hf" / rel;
}

std::string FixtureTestName(std::string rel) {
  std::replace(rel.begin(), rel.end(), '/', '_');
  return rel;
}

TempDir::TempDir() {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::path p = fs::temp_directory_path() / ("moetier-test-" + std::to_string(rd()));
    if (fs::create_directory(p)) {
      path_ = p;
      return;
    }
  }
  std::abort();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void WriteRawSafetensors(const fs::path& path, uint64_t header_len, const std::string& header,
                         const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_len >> (8 * i)) & 0xff));
  out << header << data;
}

void WriteSafetensors(const fs::path& path, const std::map<std::string, TensorSpec>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';  // the format pads the header with spaces
  WriteRawSafetensors(path, h.size(), h, data);
}

std::map<std::string, TensorSpec> ReadSafetensors(const fs::path& path) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) std::abort();
  std::map<std::string, TensorSpec> out;
  for (const auto& [name, v] : f->views())
    out[name] = TensorSpec{std::string(DTypeName(v.dtype)), v.shape,
                           std::string(reinterpret_cast<const char*>(v.bytes()), v.n_bytes)};
  return out;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

void CopyDir(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.is_regular_file()) fs::copy_file(e.path(), dst / e.path().filename());
}

CommandResult RunCli(const std::string& args, const std::string& stdin_path,
                     const std::string& env) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out", err = tmp.path() / "err";
  // The binary built beside the tests, unless MOETIER_CLI names another (test binaries carried
  // to another machine, where the build tree's path does not exist).
  const char* cli_env = std::getenv("MOETIER_CLI");
  const std::string cli = cli_env != nullptr && *cli_env != '\0' ? cli_env : MOETIER_CLI;
  // The CLI warns about MOETIER_ variables it does not read, as MOETIER_CLI is: not passed on.
  const std::string cmd = "env -u MOETIER_CLI " + (env.empty() ? "" : "'" + env + "' ") + "'" +
                          cli + "' " + args + " >'" + out.string() + "' 2>'" + err.string() +
                          "' <'" + stdin_path + "'";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

void WriteUnpackableRow(char* row, int64_t k) {
  ASSERT_EQ(k % 32, 0);
  for (int64_t j = 0; j < k; ++j) {
    const int m = static_cast<int>((j / 2) % 16);
    const float v = (j % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f, 2 * m - 40);
    const uint16_t h = F32ToBf16(v);
    std::memcpy(row + 2 * j, &h, 2);
  }
  std::vector<uint8_t> packed(DTypeRowBytes(DType::kBF16C, k));
  ASSERT_LT(kernels::PackRowBf16c(reinterpret_cast<const uint16_t*>(row), k, packed.data()), 0);
}

}  // namespace moetier::testing
