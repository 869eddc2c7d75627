#include "cli/model_options.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli/flags.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "experts/memory_limits.h"

namespace moetier::cli {

void AddResidencyOptions(CLI::App& cmd, ModelOptions& opts) {
  auto* g = cmd.add_option_group("Expert residency");
  g->add_option("--moe-backend", opts.backend,
                "auto | cpu | gpu | offload | hybrid. cpu: every expert bank locked in RAM, run "
                "by the CPU executor (with a GPU: the dense parts and the KV cache on it, as "
                "llama.cpp's --cpu-moe). gpu: the whole model and the KV cache in VRAM, run on "
                "the GPU (no GPU: the CPU, with a notice). offload: dense and KV on the GPU, "
                "banks pinned and copied into a VRAM expert cache as needed, except the "
                "--moe-cpu-layers, run by the CPU executor. hybrid: as offload, but in decode "
                "steps the cache misses are split: a share copied to the GPU, the rest computed "
                "by the CPU executor at the same time (the share from the copy and CPU speeds "
                "measured as it runs). auto (the default): gpu when the weights, the KV cache "
                "(--ctx-size, else 8192 positions) and 1 GB of workspace fit in the free VRAM, "
                "else hybrid; cpu without a usable GPU");
  g->add_flag("--no-gpu", opts.no_gpu,
              "Run everything on the CPU even when a GPU is present (nothing pinned for it)");
  g->add_option(
       "--pin-budget-gb", opts.pin_budget_gb,
       "Most GB (1e9 bytes) of expert banks to pin for the GPU (env MOETIER_PIN_BUDGET_GB; "
       "default uncapped on Linux, 40% of RAM under WSL)")
      ->check(FiniteNumber(0));
  g->add_option("--lock-budget-gb", opts.lock_budget_gb,
                "Most GB of expert banks to mlock for the CPU (env MOETIER_LOCK_BUDGET_GB; default "
                "RLIMIT_MEMLOCK, or available RAM less a margin when locking is unlimited); banks "
                "past it stay pageable")
      ->check(FiniteNumber(0));
  g->add_option("--moe-cache-gb", opts.moe_cache_gb,
                "offload: GB of VRAM for the expert cache that pinned layers' experts are copied "
                "into (at least one layer's experts; default: the VRAM free once the weights, "
                "the KV cache and the workspace are in, printed at load)")
      ->check(FiniteNumber(0, 1e6, /*min_open=*/true));
  g->add_option("--moe-cpu-layers", opts.cpu_layers,
                "MoE layers kept on the CPU in offload/hybrid: auto (fewest that fit the pin "
                "budget), 0 (none), a count (12), a fraction (0.25), layer ids and ranges (0,5,7 "
                "or 0-3 or 0-3,8; a single id as 5, with a trailing comma). Ids must be MoE "
                "layers of the model, under every backend");
  g->add_option(
      "--weight-packing", opts.weight_packing,
      "auto | none | bf16c. How the weights the CPU computes with are held in RAM. auto "
      "(default): bf16 matrices are packed losslessly into bf16c as they load (the same values "
      "in ~77% of the bytes: faster decode, more layers within the lock budget; costs load "
      "time): experts of CPU layers and, when the CPU runs them, the dense matrices but the "
      "routers; with --moe-backend hybrid, also a locked bf16c copy of each pinned layer's "
      "experts for the CPU's share of decode steps, where the lock budget and free RAM hold it "
      "(~0.77x the pinned bytes more RAM); rows too short to shrink by 10% (under 224 weights) "
      "stay. none: as stored, no copies. bf16c: "
      "as `convert --dtype bf16c --dense-dtype bf16c` (experts whatever it saves; an error if "
      "they are not bf16)");
  g->add_option(
      "--dense-memory", opts.dense_memory,
      "auto | copy | mapped. With --moe-backend cpu, where the dense matrices the CPU streams "
      "every token (attention, routers, lm_head) are read from. auto (default): copied from the "
      "model file's mapping into the process's own memory at load (measured up to 1.5x faster "
      "to stream than the mapping), unless that would leave under 2 GiB of RAM available. "
      "copy: always. mapped: read from the mapping (no extra RAM; the embedding table always "
      "is). Matrices --weight-packing packs are held packed either way");
  g->add_flag("--no-verify", opts.no_verify, "Skip checksum verification of a converted model");
  g->add_flag("--moe-collect-stats", opts.collect_stats,
              "Count per MoE layer the calls, active experts and where they ran (CPU or GPU; "
              "cache hits, misses and bytes copied with an expert cache): one summary line on "
              "stderr at exit, and \"expert_stats\" in --report and in bench --json");
}

void AddKvOptions(CLI::App& cmd, ModelOptions& opts) {
  auto* g = cmd.add_option_group("KV cache");
  auto* ctx =
      g->add_option("-c,--ctx-size", opts.ctx_size,
                    "KV cache positions, over all sequences at once (one sequence holds at most "
                    "the model's max_position_embeddings); 0 = auto: the model's window for each "
                    "sequence that may run at once, within half of the RAM free after loading "
                    "(printed at load)")
          ->check(WholeNumber(0, kMaxContext, "auto"));
  g->add_option("--kv-cache-gb", opts.kv_cache_gb,
                "KV cache size in GB instead of --ctx-size (positions follow from the model's "
                "shape and --kv-dtype)")
      ->check(FiniteNumber(0, 1e6, /*min_open=*/true))
      ->excludes(ctx);
  g->add_option("--kv-dtype", opts.kv_dtype,
                "f32 | bf16 | f16. How keys and values are stored: f32 is exact; bf16 and f16 "
                "halve the memory (outputs then differ from f32 in the last bits). Default: f32 "
                "on the CPU, bf16 with --moe-backend gpu")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  g->add_option("--kv-host-gb", opts.kv_host_gb,
                "Host RAM in GB for prefix-cache blocks the KV cache evicts: a later prompt "
                "starting with their tokens gets them copied back instead of recomputed (most "
                "useful with the cache in VRAM). Counted against the RAM left after the model "
                "loads; default 0: none")
      ->check(FiniteNumber(0, 1e6));
}

void AddModelOptions(CLI::App& cmd, ModelOptions& opts) {
  cmd.add_option("-m,--model", opts.model_dir,
                 "Model directory: a Hugging Face checkpoint (config.json + *.safetensors) or a "
                 "directory written by `moetier convert`")
      ->required();
  AddResidencyOptions(cmd, opts);
  cmd.add_option("--report", opts.report_path,
                 "Write the expert residency report (plan, settled tiers, bytes, budgets, VmLck) "
                 "as JSON to this file");
  cmd.add_option("-t,--threads", opts.n_threads,
                 "CPU threads for the forward; 0 = one per physical core this process may use (" +
                     std::to_string(ThreadPool::DefaultThreads()) +
                     " here). Workers are pinned to cores; MOETIER_PIN_THREADS=0 leaves them to "
                     "the OS scheduler")
      ->check(WholeNumber(0, ThreadPool::MaxThreads(), "one per physical core"));
  AddKvOptions(cmd, opts);
}

Expected<ResidencyOptions> ToResidencyOptions(const ModelOptions& opts) {
  ResidencyOptions r;
  MT_ASSIGN_OR_RETURN(r.backend, ParseBackend(opts.backend));
  r.budgets.pin_budget_gb = opts.pin_budget_gb;
  r.budgets.lock_budget_gb = opts.lock_budget_gb;
  r.cpu_layers = opts.cpu_layers;
  r.kv_positions = opts.ctx_size;
  if (opts.moe_cache_gb) r.expert_cache_bytes = static_cast<uint64_t>(*opts.moe_cache_gb * 1e9);
  r.verify = !opts.no_verify;
  r.use_gpu = !opts.no_gpu;
  MT_ASSIGN_OR_RETURN(r.packing, ParseWeightPacking(opts.weight_packing));
  MT_ASSIGN_OR_RETURN(r.dense_memory, ParseDenseMemory(opts.dense_memory));
  return r;
}

Status WriteReport(const ModelOptions& opts, const CausalLM& model) {
  if (opts.report_path.empty()) return OkStatus();
  std::ofstream out(opts.report_path);
  if (!out) return Status::Error(opts.report_path + ": cannot open for writing (--report)");
  nlohmann::ordered_json j = ResidencyReportJson(model.residency());
  if (model.expert_stats() != nullptr)
    j["expert_stats"] = ExpertStatsJson(model.expert_stats()->Snapshot());
  out << j.dump(2) << "\n";
  if (!out) return Status::Error(opts.report_path + ": write failed (--report)");
  return OkStatus();
}

Expected<std::unique_ptr<CausalLM>> LoadModel(const ModelOptions& opts,
                                              const BeforeWeights& before_weights) {
  LoadOptions load;
  load.n_threads = opts.n_threads;
  MT_ASSIGN_OR_RETURN(load.residency, ToResidencyOptions(opts));
  if (!opts.report_path.empty())
    MT_RETURN_IF_ERROR(CheckWritableFile(opts.report_path, "--report"));
  load.before_weights = before_weights;
  MT_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, LoadCausalLM(opts.model_dir, load));
  if (opts.collect_stats) model->CollectExpertStats();
  MT_RETURN_IF_ERROR(WriteReport(opts, *model));
  return model;
}

Status FinishModel(const ModelOptions& opts, const CausalLM& model) {
  if (model.expert_stats() == nullptr) return OkStatus();
  LogInfo(ExpertStatsSummary(model.expert_stats()->Snapshot()));
  if (const int64_t replayed = model.ReplayedSteps(); replayed > 0)
    LogInfo("gpu: " + std::to_string(replayed) + " decode steps replayed from CUDA graphs");
  return WriteReport(opts, model);
}

namespace {

std::string Gb(double gb) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", gb);
  return text;
}

// --kv-host-gb: within the RAM available now, the model's banks already resident.
Status SetHostKvTier(const ModelOptions& opts, EngineOptions& e, const CausalLM& model) {
  if (opts.kv_host_gb <= 0) return OkStatus();
  e.kv_host_bytes = static_cast<uint64_t>(opts.kv_host_gb * 1e9);
  const uint64_t available = ReadHostMemoryInfo().available_bytes;
  if (available > 0 && e.kv_host_bytes > available)
    return Status::Error("--kv-host-gb " + Gb(opts.kv_host_gb) + ": only " +
                         Gb(static_cast<double>(available) / 1e9) +
                         " GB of RAM is available with the model loaded; lower it");
  const uint64_t block =
      KvPool::BlockBytes(model.kv_shape(), KvPool::kDefaultBlockSize, e.kv_dtype);
  LogInfo("kv host tier: " + Gb(opts.kv_host_gb) + " GB: room for " +
          std::to_string(e.kv_host_bytes / block) + " blocks (" +
          std::to_string(KvPool::kDefaultBlockSize) +
          " positions each) that the KV cache evicts, for later prefix matches");
  return OkStatus();
}

}  // namespace

std::string KvDTypeName(const ModelOptions& opts, const CausalLM& model) {
  if (!opts.kv_dtype.empty()) return opts.kv_dtype;
  return model.device() == ComputeDevice::kGpu ? "bf16" : "f32";
}

Expected<EngineOptions> MakeEngineOptions(const ModelOptions& opts, const CausalLM& model,
                                          int parallel, int64_t max_batch_tokens) {
  EngineOptions e;
  e.max_running = parallel;
  e.max_batch_tokens = max_batch_tokens;
  const bool on_gpu = model.device() == ComputeDevice::kGpu;
  const std::string kv_dtype = KvDTypeName(opts, model);
  MT_ASSIGN_OR_RETURN(e.kv_dtype, ParseKvDType(kv_dtype));
  const uint64_t per_position =
      KvPool::BlockBytes(model.kv_shape(), 1, e.kv_dtype);  // all layers, K and V
  const int64_t window = model.config().max_position_embeddings;
  std::string how;
  if (opts.ctx_size > 0) {
    e.kv_positions = opts.ctx_size;
    how = "--ctx-size";
  } else if (opts.kv_cache_gb) {
    e.kv_positions =
        static_cast<int64_t>(*opts.kv_cache_gb * 1e9 / static_cast<double>(per_position));
    how = "--kv-cache-gb";
    if (e.kv_positions < 1)
      return Status::Error("--kv-cache-gb " + std::to_string(*opts.kv_cache_gb) +
                           ": less than one position (" + std::to_string(per_position) +
                           " bytes) of this model");
  } else {
    const int64_t wanted = (window > 0 ? window : 8192) * parallel;
    const auto ram = static_cast<int64_t>(static_cast<double>(model.KvMemoryFree()) *
                                          kDefaultKvRamShare / static_cast<double>(per_position));
    e.kv_positions = std::max<int64_t>(1, std::min(wanted, ram));
    how = e.kv_positions < wanted
              ? (on_gpu ? "auto: half the free VRAM" : "auto: half the free RAM")
              : "auto: the model's window";
    if (parallel > 1 && e.kv_positions == wanted) how += " x " + std::to_string(parallel);
  }
  MT_RETURN_IF_ERROR(SetHostKvTier(opts, e, model));
  const double gb = static_cast<double>(per_position) * static_cast<double>(e.kv_positions) / 1e9;
  char line[256];
  std::snprintf(
      line, sizeof line,
      "kv cache: %lld positions (%s), %s, %.2f GB at most (%s), one sequence up to %lld",
      static_cast<long long>(e.kv_positions), how.c_str(), kv_dtype.c_str(), gb,
      on_gpu ? "in VRAM, allocated at once" : "RAM is used as positions fill",
      static_cast<long long>(window > 0 ? std::min(window, e.kv_positions) : e.kv_positions));
  LogInfo(line);
  return e;
}

Expected<std::unique_ptr<Engine>> MakeEngine(const ModelOptions& opts, CausalLM& model,
                                             const text::Tokenizer* tokenizer, int parallel,
                                             int64_t max_batch_tokens) {
  MT_ASSIGN_OR_RETURN(EngineOptions e, MakeEngineOptions(opts, model, parallel, max_batch_tokens));
  return Engine::Create(model, tokenizer, e);
}

Status CheckTokenIds(std::span<const int32_t> ids, const ModelConfig& config,
                     std::string_view flag) {
  for (int32_t id : ids)
    if (id >= config.vocab_size)
      return Status::Error(std::string(flag) + ": token id " + std::to_string(id) +
                           " is outside the model's vocabulary of " +
                           std::to_string(config.vocab_size) + " (ids 0.." +
                           std::to_string(config.vocab_size - 1) + ")");
  return OkStatus();
}

Expected<std::vector<int32_t>> ParseTokenList(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
      return Status::Error(flag + ": '" + item + "' is not a token id (expected e.g. 3,17,42)");
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

}  // namespace moetier::cli
