// moetier convert: a Hugging Face checkpoint (or a float conversion of one) → the bank format.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/thread_pool.h"
#include "model/convert.h"

namespace moetier::cli {

namespace {

// Set by SIGINT/SIGTERM; the conversion polls it between steps and stops, removing what it had
// written. A signal handler may only touch a lock-free atomic, hence this process-wide flag.
std::atomic<bool> g_convert_cancelled{false};

void OnConvertSignal(int) {
  g_convert_cancelled.store(true);
}

// Ctrl-C (or a TERM from a job scheduler) during a long conversion ends it cleanly: without
// this the process would die with a half-written staging directory beside --out. A second
// signal acts as usual (SA_RESETHAND), in case the first is not honoured soon enough.
void StopOnSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnConvertSignal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace

Command AddConvertCommand(CLI::App& root) {
  struct Opts {
    std::string model, out;
    double shard_gib = 8;
    bool overwrite = false;
    std::string dtype = "bf16";
    std::string dense_dtype = "same";
    int n_threads = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "convert",
      "Convert a Hugging Face checkpoint into moetier's bank format: each MoE layer's experts in "
      "one contiguous 4096-aligned bank, dense weights beside, an index with byte lengths and "
      "xxh64 checksums; config and tokenizer files are copied. Experts can be packed "
      "losslessly (bf16c) or quantized to GGUF's q8_0 or q4_0 blocks (--dtype), dense matrices "
      "too (--dense-dtype). Every command's --model accepts the result. The input may also be "
      "an earlier conversion with bf16/bf16c/f16/f32 experts (e.g. a bf16 conversion quantized "
      "to q8_0 and q4_0 without the checkpoint); quantized weights are only ever copied, never "
      "quantized twice.");
  cmd->add_option("-m,--model", o->model,
                  "Hugging Face model directory to convert, or a directory written by convert "
                  "whose experts are bf16/bf16c/f16/f32 (its checksums are verified as it is "
                  "read)")
      ->required();
  cmd->add_option(
         "-o,--out", o->out,
         "Output directory: new, empty, or an earlier conversion with --overwrite. Written "
         "in a temporary directory that becomes --out only when complete; a failed or "
         "interrupted conversion leaves --out as it was")
      ->required();
  const std::vector<std::string> dtypes(kConvertDTypeFlags.begin(), kConvertDTypeFlags.end());
  cmd->add_option("--dtype", o->dtype,
                  "Expert weights: bf16 (copied from a bf16 checkpoint, rounded from f16/f32), "
                  "bf16c (the same bf16 values packed losslessly, ~12.4 bits a weight: ~77 % of "
                  "bf16's bytes to stream; a GPU expands it to bf16 in VRAM), q8_0 (8.5 bits a "
                  "weight, near-lossless) or q4_0 (4.5 bits, lossy); bf16c/q8_0/q4_0 need "
                  "hidden_size and the expert width to be multiples of 32")
      ->check(CLI::IsMember(dtypes))
      ->capture_default_str();
  std::vector<std::string> dense_dtypes = {"same"};
  dense_dtypes.insert(dense_dtypes.end(), dtypes.begin(), dtypes.end());
  cmd->add_option("--dense-dtype", o->dense_dtype,
                  "Dense matrices (attention, dense MLPs, embeddings, lm_head): same (as in the "
                  "input), bf16, bf16c, q8_0 or q4_0. Routers, norms and biases always keep "
                  "the checkpoint's dtype, as do matrices whose rows are not multiples of 32 "
                  "(or, for bf16c, longer than 65504) when packing or quantizing")
      ->check(CLI::IsMember(dense_dtypes))
      ->capture_default_str();
  cmd->add_option("--shard-gib", o->shard_gib, "Start a new data file past this many GiB")
      ->check(FiniteNumber(0, 1 << 20, /*min_open=*/true));
  cmd->add_option("-t,--threads", o->n_threads,
                  "Threads converting and quantizing; 0 = every core this process may use")
      ->check(WholeNumber(0, ThreadPool::MaxThreads(), "every core"));
  cmd->add_flag("--overwrite", o->overwrite,
                "Replace an earlier conversion in --out (everything in that directory), once the "
                "new one is complete");
  return {cmd, [o]() -> int {
            ConvertOptions opts;
            opts.shard_bytes =
                static_cast<uint64_t>(o->shard_gib * static_cast<double>(1ull << 30));
            opts.overwrite = o->overwrite;
            opts.n_threads = o->n_threads;
            // IsMember has already refused anything else.
            opts.expert_dtype = ConvertDTypeFromFlag(o->dtype).value_or(DType::kBF16);
            if (o->dense_dtype != "same") opts.dense_dtype = ConvertDTypeFromFlag(o->dense_dtype);
            opts.cancel = &g_convert_cancelled;
            StopOnSignals();
            auto r = ConvertCheckpoint(o->model, o->out, opts);
            if (!r.ok()) {
              const int code = ReportError(r.message());
              return g_convert_cancelled.load() ? 128 + SIGINT : code;
            }
            std::fprintf(stderr,
                         "wrote %s: %d data file(s), %.2f GB, %d expert banks (%s), %d dense "
                         "tensors (%d converted)\n",
                         o->out.c_str(), r->n_files, static_cast<double>(r->bytes_written) / 1e9,
                         r->n_banks, std::string(DTypeName(r->expert_dtype)).c_str(), r->n_tensors,
                         r->n_dense_converted);
            return 0;
          }};
}

}  // namespace moetier::cli
