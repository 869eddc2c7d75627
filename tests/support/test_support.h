// Helpers shared by tests: fixture paths, temporary directories, a safetensors writer for
// building (possibly broken) checkpoints inside a test, and running the CLI.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/causal_lm.h"

namespace moetier::testing {

std::filesystem::path FixturesDir();

// The smallest expert cache --moe-backend offload accepts for a bf16 fixture: one layer's
// experts, each slot rounded up to 256 bytes as the backend lays them out.
uint64_t OneLayerOfExperts(const std::filesystem::path& dir);

// LoadOptions with n threads, the CPU engine whether or not a GPU is present (--no-gpu: tests of
// the GPU backends ask for one), and everything else default.
LoadOptions WithThreads(int n);
// An engine for `model` with a KV pool of `kv_positions` (f32) and up to `parallel` sequences.
std::unique_ptr<Engine> MakeEngine(CausalLM& model, int64_t kv_positions,
                                   const text::Tokenizer* tokenizer = nullptr, int parallel = 1);
// Three sequences sharing a pool of blocks of `block_size` positions: their prompts (20, 7 and
// 250 tokens) in a step each, then `n_steps` steps in which each decodes one token (the longest
// crosses the GPU attention's context bucket at position 256, so the decode steps take two
// shapes). Calls step(batch, decoding, label) for each step in turn.
void ForEachThreeSequenceStep(
    int64_t block_size, int64_t n_steps,
    const std::function<void(const Batch&, bool decoding, const std::string& label)>& step);
// An int64 tensor's values as int32 (the fixtures' token ids).
std::vector<int32_t> IntsOf(const TensorView& t);
// Greedy continuations of a fixture's prompt0..2 by `model` equal the reference's
// (reference.safetensors: promptN.tokens, .greedy, .greedy_margin) until its margin falls under
// 1e-3 (a near tie the tolerances allow to go either way); at least one step compared each.
void ExpectGreedyLikeReference(CausalLM& model, const SafetensorsFile& reference);
// tests/fixtures/hf/<rel>, e.g. "qwen3_moe" or "realvocab/qwen3_moe_tiny".
std::filesystem::path HfFixture(const std::string& rel);
// A fixture's rel as a test name: "realvocab/qwen3_moe_tiny" -> "realvocab_qwen3_moe_tiny".
std::string FixtureTestName(std::string rel);

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct TensorSpec {
  std::string dtype;  // safetensors spelling, e.g. "BF16"
  std::vector<int64_t> shape;
  std::string bytes;  // raw data
};

// Writes a well-formed safetensors file holding `tensors` (in name order).
void WriteSafetensors(const std::filesystem::path& path,
                      const std::map<std::string, TensorSpec>& tensors);
// Writes a file of an 8-byte length followed by `header` and `data`, exactly as given.
void WriteRawSafetensors(const std::filesystem::path& path, uint64_t header_len,
                         const std::string& header, const std::string& data);

// Every tensor of a safetensors file, as specs that WriteSafetensors can write back.
std::map<std::string, TensorSpec> ReadSafetensors(const std::filesystem::path& path);

std::string ReadFile(const std::filesystem::path& path);
void WriteFile(const std::filesystem::path& path, const std::string& text);
// Copies every file of a fixture directory into `dst`.
void CopyDir(const std::filesystem::path& src, const std::filesystem::path& dst);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the moetier CLI with `args` (shell-quoted by the caller where needed), with stdin from
// `stdin_path` (default: /dev/null) and `env` ("NAME=value", or empty) added to the environment.
// The binary: $MOETIER_CLI if set, else the one built with the tests.
CommandResult RunCli(const std::string& args, const std::string& stdin_path = "/dev/null",
                     const std::string& env = "");

// Writes k bf16 values at `row` with 32 distinct high bytes (±2^(2m-40), m < 16), each k/32
// times: any table of 16 leaves k/2 >= 16 exceptions, more than the 12 a BF16C row may have, so
// the row cannot be packed. The values are tiny, so a model's output stays finite.
void WriteUnpackableRow(char* row, int64_t k);

}  // namespace moetier::testing
