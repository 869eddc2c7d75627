#include "core/tuning.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>

namespace moetier {

const std::array<TuningKnobSpec, 27> kTuningKnobSpecs = {{
    {"MOETIER_AMX_MIN_TOKENS", &TuningKnobs::amx_min_tokens, 1, 1 << 20,
     "smallest batch of tokens whose q8_0/bf16 matmuls use AMX tiles"},
    {"MOETIER_BF16C_EXPAND_MIN_TOKENS", &TuningKnobs::bf16c_expand_min_tokens, 1, 1 << 20,
     "smallest batch for which bf16c rows are expanded once and run on the batch kernels"},
    {"MOETIER_FLOAT_PREFETCH_BYTES", &TuningKnobs::float_prefetch_bytes, 64, 16384,
     "how far ahead the AVX2 kernels prefetch a bf16/bf16c/f16/f32 weight stream"},
    {"MOETIER_CONVERT_BATCH_ROWS", &TuningKnobs::convert_batch_rows, 0, 1,
     "1: a bf16/bf16c/f16 batch converts its weight rows to float32 once for all its tokens; 0: "
     "in registers for every tile of tokens (bf16c expanded to bf16 first)"},
    {"MOETIER_QUANT_PREFETCH_BYTES", &TuningKnobs::quant_prefetch_bytes, 64, 16384,
     "how far ahead decode prefetches a q8_0/q4_0 weight stream"},
    {"MOETIER_PARALLEL_PREPARE_TOKENS", &TuningKnobs::parallel_prepare_tokens, 1, 1 << 20,
     "smallest batch whose activations are prepared on the thread pool"},
    {"MOETIER_TASK_ROWS", &TuningKnobs::task_rows, 1, 1 << 24,
     "weight rows per matmul task (replaces the size rule)"},
    {"MOETIER_TASKS_PER_THREAD", &TuningKnobs::tasks_per_thread, 1, 4096,
     "matmul tasks per thread the size rule aims for"},
    {"MOETIER_ATTN_HEADS_PER_TASK", &TuningKnobs::attn_heads_per_task, 1, 4096,
     "query heads per attention task"},
    {"MOETIER_SPIN_US", &TuningKnobs::spin_us, 0, 1'000'000,
     "microseconds an idle worker spins before it sleeps"},
    {"MOETIER_PIN_THREADS", &TuningKnobs::pin_threads, 0, 1,
     "1: pin each worker to a core; 0: leave them to the OS scheduler"},
    {"MOETIER_IO_THREADS", &TuningKnobs::io_threads, 1, 64,
     "threads reading expert banks at load, each with one request in flight (default 8)"},
    {"MOETIER_IO_CHUNK_MIB", &TuningKnobs::io_chunk_mib, 1, 1024,
     "MiB each bank-reading thread asks for in one read call at load (default 8)"},
    {"MOETIER_STREAM_MIN_TOKENS", &TuningKnobs::stream_min_tokens, 1, int64_t{1} << 40,
     "smallest step (tokens) for which offload streams whole banks to the GPU"},
    {"MOETIER_FETCH_PERCENT", &TuningKnobs::fetch_percent, 0, 100,
     "hybrid: percent of a step's cache misses the copy engine fetches (the rest: the CPU)"},
    {"MOETIER_CPU_SHARE_ASYNC", &TuningKnobs::cpu_share_async, 0, 1,
     "hybrid: 1 runs the CPU's share on a worker the GPU waits for; 0 (default) on the host "
     "thread"},
    {"MOETIER_CACHE_LRU", &TuningKnobs::cache_lru, 0, 1,
     "offload/hybrid: 1 evicts the GPU expert cache's least recently used slot; 0 (default) the "
     "expert used next the latest in the layers' order"},
    {"MOETIER_DEVICE_DRAWS", &TuningKnobs::device_draws, 0, 1,
     "GPU: 1 (default) draws temperature/top-p/min-p tokens on the device; 0 copies the rows "
     "and draws on the host"},
    {"MOETIER_CUDA_GRAPHS", &TuningKnobs::cuda_graphs, 0, 1,
     "gpu: 1 (default) replays decode steps from recorded CUDA graphs; 0 launches each kernel"},
    {"MOETIER_CUDA_PDL", &TuningKnobs::cuda_pdl, 0, 1,
     "GPU: 1 (default) lets each kernel be scheduled while the one before it finishes "
     "(programmatic dependent launch); 0 waits for it to drain"},
    {"MOETIER_CUDA_FUSE", &TuningKnobs::cuda_fuse, 0, 1,
     "GPU: 1 fuses a decode step's launches (the quantized products of one x, top-k with "
     "grouping); 0 (default) launches each apart"},
    {"MOETIER_CUDA_NORM_FUSE", &TuningKnobs::cuda_norm_fuse, 0, 2,
     "GPU: 2 (default) has a decode step's norms scan the residual sums for NaN/inf and "
     "quantize their output for the Q8_0/Q4_0 products and experts that read it, in their own "
     "launch; 1 the same but the experts quantize x themselves; 0 launches scan and quantizing "
     "apart"},
    {"MOETIER_CUDA_PREFETCH", &TuningKnobs::cuda_prefetch, 0, 1,
     "GPU: 1 (default) has decode kernels ask L2 for their weights before they wait for the "
     "kernel before them; 0 does not"},
    {"MOETIER_CUDA_ATTN_CHUNK", &TuningKnobs::cuda_attn_chunk, 16, 4096,
     "GPU: fewest positions a split of the decode attention takes (the split granularity)"},
    {"MOETIER_CUDA_GEMV_ASSIGN", &TuningKnobs::cuda_gemv_assign, 0, 4096,
     "GPU: most assignments (tokens x top-k) of a decode step whose experts run a warp per "
     "output row (0: never)"},
    {"MOETIER_STAGE_LOCKED", &TuningKnobs::stage_locked, 0, 1,
     "with a GPU: 1 stages locked layers' banks to the GPU for every long prefill step, 0 "
     "never (the CPU executor computes them); unset: the cheaper as measured"},
    {"MOETIER_PACK_PINNED", &TuningKnobs::pack_pinned, 0, 1,
     "offload/hybrid: 1 (default) holds pinned bf16 banks as bf16c, copied packed and expanded "
     "in VRAM; 0 as stored"},
}};

const std::array<std::string_view, 9> kOtherEnvironmentVariables = {
    "MOETIER_CPU_ISA",         "MOETIER_PIN_BUDGET_GB", "MOETIER_LOCK_BUDGET_GB",
    "MOETIER_INJECT_FAILURES", "MOETIER_DEBUG",         "MOETIER_TEST_SEED",
    "MOETIER_CACHE_DIR",       "MOETIER_CLI",           "MOETIER_TEST_FORCED_OUTPUT"};

namespace {

Status ParseKnob(const TuningKnobSpec& spec, std::string_view text, TuningKnobs& knobs) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const std::string range = std::to_string(spec.min) + ".." + std::to_string(spec.max);
  if (ec != std::errc() || end != text.data() + text.size())
    return Status::Error(std::string(spec.name) + "='" + std::string(text) +
                         "' is not an integer; expected " + range + " (" + std::string(spec.help) +
                         "), or unset it for the default");
  if (v < spec.min || v > spec.max)
    return Status::Error(std::string(spec.name) + "=" + std::string(text) + " is outside " + range +
                         " (" + std::string(spec.help) + ")");
  knobs.*spec.field = v;
  return OkStatus();
}

bool IsKnownVariable(std::string_view name) {
  for (const auto& s : kTuningKnobSpecs)
    if (s.name == name) return true;
  for (auto n : kOtherEnvironmentVariables)
    if (n == name) return true;
  return false;
}

}  // namespace

Expected<TuningKnobs> ParseTuningKnobs(EnvLookup env) {
  TuningKnobs knobs;
  for (const auto& spec : kTuningKnobSpecs) {
    const char* v = env(std::string(spec.name).c_str());
    if (v == nullptr || *v == '\0') continue;
    MT_RETURN_IF_ERROR(ParseKnob(spec, v, knobs));
  }
  return knobs;
}

const TuningKnobs& Tuning() {
  static const TuningKnobs knobs = [] {
    auto parsed = ParseTuningKnobs([](const char* name) { return std::getenv(name); });
    return parsed.ok() ? *parsed : TuningKnobs{};
  }();
  return knobs;
}

Expected<std::vector<std::string>> CheckEnvironment() {
  MT_RETURN_IF_ERROR(ParseTuningKnobs([](const char* name) { return std::getenv(name); }).status());
  std::vector<std::string> warnings;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name.substr(0, 8) != "MOETIER_" || IsKnownVariable(name)) continue;
    warnings.push_back("environment variable " + std::string(name) +
                       " is not one moetier reads (misspelt? docs/tuning.md lists them); ignored");
  }
  return warnings;
}

}  // namespace moetier
