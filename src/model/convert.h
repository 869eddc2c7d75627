// moetier convert: a Hugging Face checkpoint → the bank format (DESIGN.md "Bank format"). Streams
// layer by layer from the checkpoint's memory maps to the output files, so peak memory is a
// few layers of page cache plus one conversion chunk, not the model. The source may also be an
// earlier conversion whose experts are float (bf16/f16/f32): its banks are read through their
// memory maps, each checked against its xxh64 first, and the result is byte for byte what the
// checkpoint would give when that conversion kept its values (bf16 from bf16). Quantized
// weights in such a source are copied as they are, never quantized twice.
//
// The experts (`--dtype`) and, optionally, the dense matrices (`--dense-dtype`) may be stored
// in another dtype than the checkpoint's: bf16 (rounded to nearest even from f16/f32, copied
// from bf16), bf16c (the same bf16 values packed losslessly into ~77 % of the bytes;
// kernels/cpu/bf16c.h) or GGUF's block-quantized Q8_0 / Q4_0 (kernels/cpu/quant.h), which halve
// or quarter the bytes each decode step streams. BF16C is exact both ways, so a bf16c
// conversion is also a float source for any other dtype. The index records the choice
// (expert_dtype, dense_dtype), which is what lets the loader accept weights that differ from
// config.json.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace moetier {

struct ConvertOptions {
  uint64_t shard_bytes = 8ull << 30;  // start a new data file past this size (--shard-gib)
  // Replace an earlier conversion in the output directory (all of that directory's contents),
  // once the new one is complete. Without it the directory must be new or empty.
  bool overwrite = false;
  // --dtype: the experts' dtype, kBF16, kBF16C, kQ8_0 or kQ4_0. The block formats need row
  // lengths (d_model for gate/up, the expert width for down) that are multiples of 32; BF16C
  // also rows of at most 12 weights outside their 16 most common sign/exponent classes (any
  // trained or random-normal weights; a row that is not is an error naming it).
  DType expert_dtype = DType::kBF16;
  // --dense-dtype: nullopt ("same") keeps every dense tensor as in the checkpoint. Otherwise
  // kBF16, kBF16C, kQ8_0 or kQ4_0 for every 2-D matrix (attention, dense MLPs, embeddings,
  // lm_head) except the MoE routers; 1-D tensors (norms, biases) and routers keep their dtype,
  // as do matrices whose rows are not whole 32-blocks when the target is a block format.
  std::optional<DType> dense_dtype;
  int n_threads = 0;  // converting threads (--threads); <= 0: every core this process may use
  // Polled between steps (a tensor, a chunk of rows or experts); once true, the conversion stops
  // with an error and leaves nothing behind. Set by the CLI's SIGINT/SIGTERM handler.
  const std::atomic<bool>* cancel = nullptr;
};

struct ConvertSummary {
  uint64_t bytes_written = 0;
  int n_files = 0;
  int n_banks = 0;
  int n_tensors = 0;
  int n_dense_converted = 0;  // dense tensors stored in another dtype than the checkpoint's
  DType expert_dtype = DType::kBF16;
};

// The spellings of --dtype (and, with "same", --dense-dtype), lowercase as users type them.
inline constexpr std::array<std::string_view, 4> kConvertDTypeFlags = {"bf16", "bf16c", "q8_0",
                                                                       "q4_0"};
// "bf16" → kBF16, "bf16c" → kBF16C, "q8_0" → kQ8_0, "q4_0" → kQ4_0; nullopt for anything else.
std::optional<DType> ConvertDTypeFromFlag(std::string_view flag);

// Converts the model in `hf_dir` into `out_dir`, which must not exist, be empty, or hold an
// earlier conversion and options.overwrite. The model is checked as the loader checks it — every
// tensor it reads present with the dtype and shape config.json implies, and no tensor that
// config.json does not account for — and --out is checked, before anything is written. The
// output is written into a staging directory that becomes `out_dir` only once complete: a
// failure of any kind (a refused tensor, a checksum mismatch in a converted source, a write
// error, an interruption, an exception) returns an error and leaves `out_dir` as it was.
// Nothing is thrown.
Expected<ConvertSummary> ConvertCheckpoint(const std::filesystem::path& hf_dir,
                                           const std::filesystem::path& out_dir,
                                           const ConvertOptions& options);

}  // namespace moetier
