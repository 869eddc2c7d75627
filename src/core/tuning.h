// Tuning knobs: the MOETIER_* environment variables that override a kernel's or the thread pool's
// built-in choice (task sizes, prefetch distances, when AMX tiles start paying). A user should
// never need them; benchmarks and experiments do. They are read once, typed and validated here
// and nowhere else: a malformed value is an error naming the variable, never a silent default.
// docs/tuning.md lists them with their defaults.
//
// Variables that belong to a feature rather than to tuning are parsed where the feature lives
// but are listed here too (kOtherEnvironmentVariables), so CheckEnvironment() knows every
// MOETIER_* name and can point out a misspelt one.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/function_ref.h"
#include "core/status.h"

namespace moetier {

struct TuningKnobs {
  // Each unset knob leaves the code's own choice (the named constant where it is used).
  std::optional<int64_t> amx_min_tokens;           // MOETIER_AMX_MIN_TOKENS
  std::optional<int64_t> bf16c_expand_min_tokens;  // MOETIER_BF16C_EXPAND_MIN_TOKENS
  std::optional<int64_t> float_prefetch_bytes;     // MOETIER_FLOAT_PREFETCH_BYTES
  std::optional<int64_t> convert_batch_rows;       // MOETIER_CONVERT_BATCH_ROWS (0 or 1)
  std::optional<int64_t> quant_prefetch_bytes;     // MOETIER_QUANT_PREFETCH_BYTES
  std::optional<int64_t> parallel_prepare_tokens;  // MOETIER_PARALLEL_PREPARE_TOKENS
  std::optional<int64_t> task_rows;                // MOETIER_TASK_ROWS
  std::optional<int64_t> tasks_per_thread;         // MOETIER_TASKS_PER_THREAD
  std::optional<int64_t> attn_heads_per_task;      // MOETIER_ATTN_HEADS_PER_TASK
  std::optional<int64_t> spin_us;                  // MOETIER_SPIN_US
  std::optional<int64_t> pin_threads;              // MOETIER_PIN_THREADS (0 or 1)
  std::optional<int64_t> io_threads;               // MOETIER_IO_THREADS
  std::optional<int64_t> io_chunk_mib;             // MOETIER_IO_CHUNK_MIB
  std::optional<int64_t> stream_min_tokens;        // MOETIER_STREAM_MIN_TOKENS
  std::optional<int64_t> fetch_percent;            // MOETIER_FETCH_PERCENT
  std::optional<int64_t> cpu_share_async;          // MOETIER_CPU_SHARE_ASYNC (0 or 1)
  std::optional<int64_t> cache_lru;                // MOETIER_CACHE_LRU (0 or 1)
  std::optional<int64_t> cuda_graphs;              // MOETIER_CUDA_GRAPHS (0 or 1)
  std::optional<int64_t> device_draws;             // MOETIER_DEVICE_DRAWS (0 or 1)
  std::optional<int64_t> cuda_pdl;                 // MOETIER_CUDA_PDL (0 or 1)
  std::optional<int64_t> cuda_fuse;                // MOETIER_CUDA_FUSE (0 or 1)
  std::optional<int64_t> cuda_norm_fuse;           // MOETIER_CUDA_NORM_FUSE (0, 1 or 2)
  std::optional<int64_t> cuda_prefetch;            // MOETIER_CUDA_PREFETCH (0 or 1)
  std::optional<int64_t> cuda_attn_chunk;          // MOETIER_CUDA_ATTN_CHUNK
  std::optional<int64_t> cuda_gemv_assign;         // MOETIER_CUDA_GEMV_ASSIGN
  std::optional<int64_t> stage_locked;             // MOETIER_STAGE_LOCKED (0 or 1)
  std::optional<int64_t> pack_pinned;              // MOETIER_PACK_PINNED (0 or 1)
};

// One knob: its variable, the field it sets, its accepted range and what it does.
struct TuningKnobSpec {
  std::string_view name;
  std::optional<int64_t> TuningKnobs::*field;
  int64_t min, max;
  std::string_view help;
};
extern const std::array<TuningKnobSpec, 27> kTuningKnobSpecs;

// MOETIER_* variables parsed elsewhere (with their own validation, reported by
// CheckEnvironment): the kernel level, budgets, failure injection and seeds for tests, debug
// logging, the hybrid split's cache folder, and the server tests' binary and forced output.
extern const std::array<std::string_view, 9> kOtherEnvironmentVariables;

using EnvLookup = FunctionRef<const char*(const char*)>;

// Parses every knob from `env` (getenv in production). An empty value counts as unset.
Expected<TuningKnobs> ParseTuningKnobs(EnvLookup env);

// The process's knobs, read from the environment at first use. Malformed values are refused by
// CheckEnvironment() before any work starts; code that runs without it (tests, benchmarks)
// gets the defaults for a malformed knob.
const TuningKnobs& Tuning();

// Every MOETIER_* variable of `environ`: well-formed (an error naming the first bad one), and
// known (each unknown name is returned as a warning line, e.g. a misspelt knob).
Expected<std::vector<std::string>> CheckEnvironment();

}  // namespace moetier
