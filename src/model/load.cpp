#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <set>

#include "backend/kv_cache.h"
#include "backend/make_backend.h"
#include "core/log.h"
#include "core/tuning.h"
#include "experts/host_memory.h"
#include "experts/memory_limits.h"
#include "experts/weight_packing.h"
#include "model/bank_loader.h"
#include "model/causal_lm.h"
#include "model/dense_holding.h"
#include "model/model_source.h"

namespace moetier {

namespace {

// Threads reading banks: enough to keep an NVMe queue deep, not more than the cores. On an H100
// host's NVMe, 8 read the 8-layer q4_0 model's banks at 1.97-1.99 GB/s against 4's 1.87-1.92.
constexpr int kDefaultIoThreads = 8;

// A usable GPU, unless --no-gpu.
bool GpuUsable(const ResidencyOptions& o) {
  return o.use_gpu && GpuAvailable();
}

// --moe-backend auto leaves room in VRAM for this many KV positions when --ctx-size does not say.
constexpr int64_t kAutoKvPositions = 8192;
// ... and this much beside the weights and the KV cache: activations, cuBLAS, the CUDA runtime.
constexpr uint64_t kAutoGpuWorkspaceBytes = uint64_t{1} << 30;

// The bytes of tensor `t` in VRAM: BF16C is expanded to bf16 there (~1.3x its packed bytes).
uint64_t GpuHeldBytes(const TensorView& t) {
  if (t.dtype != DType::kBF16C || t.shape.size() != 2) return t.n_bytes;
  return static_cast<uint64_t>(t.dim(0)) * DTypeRowBytes(DType::kBF16, t.dim(1));
}

// The bytes in VRAM of every tensor that is not an expert's.
uint64_t DenseBytes(const ModelSource& s) {
  const std::set<std::string> experts = ExpertTensorNames(s);
  uint64_t n = 0;
  for (const std::string& name : s.dense().Names())
    if (!experts.contains(name)) n += GpuHeldBytes(*s.dense().Find(name));
  return n;
}

// An expert bank as VRAM holds it: BF16C expanded to bf16.
ExpertLayout VramLayout(const ModelSource& s) {
  return ExpertLayout{s.layout.d_model, s.layout.width,
                      s.layout.dtype == DType::kBF16C ? DType::kBF16 : s.layout.dtype};
}

// The bytes of every expert bank in VRAM.
uint64_t GpuExpertBytes(const ModelSource& s) {
  return VramLayout(s).bank_bytes(s.config.n_experts) * s.banks.size();
}

// The gpu backend's layers as reported once it copied the banks to VRAM: their tier, and the
// bytes and dtype that VRAM holds (the host read them as stored, pageable).
void ReportHeldInVram(const ModelSource& s, std::vector<LayerResidency>& layers) {
  const ExpertLayout held = VramLayout(s);
  for (LayerResidency& l : layers) {
    l.tier = Tier::kGpu;
    l.dtype = held.dtype;
    l.bytes = held.bank_bytes(s.config.n_experts);
  }
}

// --moe-backend auto: gpu when every expert, the dense weights and the KV cache asked for (bf16,
// as the GPU keeps it) fit in the free VRAM beside a workspace; else hybrid (offload's pinned
// layers and VRAM expert cache, each decode step's misses split between copies and the CPU
// executor by their measured speeds: it leaves the CPU idle only where copying is faster, so it
// is never slower than offload by more than the split's bookkeeping; measured on the H200 at
// 1.05-3.3x offload's decode); the CPU when no GPU is usable or the GPU kernels do not take the
// model.
Backend ResolveAutoBackend(const ModelSource& s, const ResidencyOptions& o) {
  if (!GpuUsable(o)) return Backend::kCpu;
  const ModelConfig& c = s.config;
  ModelDims dims;
  dims.head_dim = c.head_dim;
  dims.n_experts = c.n_experts;
  dims.top_k = c.n_experts_per_token;
  if (Status fits = CheckGpuDims(dims); !fits.ok()) {
    LogInfo("--moe-backend auto: cpu (" + fits.message() + ")");
    return Backend::kCpu;
  }
  const uint64_t experts = GpuExpertBytes(s);
  const int64_t positions = o.kv_positions > 0 ? o.kv_positions : kAutoKvPositions;
  const uint64_t kv =
      KvPool::BlockBytes(KvShape{c.n_layers, c.n_kv_heads, c.head_dim}, positions, DType::kBF16);
  const uint64_t need = experts + DenseBytes(s) + kv + kAutoGpuWorkspaceBytes;
  const uint64_t free = GpuFreeBytes();
  const Backend b = need <= free ? Backend::kGpu : Backend::kHybrid;
  char line[240];
  std::snprintf(line, sizeof line,
                "--moe-backend auto: %s (weights, %lld KV positions and a workspace need %.2f GB; "
                "%.2f GB of VRAM free)",
                b == Backend::kGpu ? "gpu" : "hybrid", static_cast<long long>(positions),
                static_cast<double>(need) / 1e9, static_cast<double>(free) / 1e9);
  LogInfo(line);
  return b;
}

Expected<ResidencyPlan> PlanFor(const ModelSource& s, const ResidencyOptions& o) {
  const HostMemoryInfo host = ReadHostMemoryInfo();
  MT_ASSIGN_OR_RETURN(Budgets budgets, ResolveBudgets(o.budgets, host));
  MT_ASSIGN_OR_RETURN(CpuLayersSpec spec, ParseCpuLayersSpec(o.cpu_layers));
  MT_ASSIGN_OR_RETURN(const DType cpu_dtype, CpuExpertDType(s.layout, o.packing));
  PlanInputs in;
  in.backend = o.backend == Backend::kAuto ? ResolveAutoBackend(s, o) : o.backend;
  in.gpu_available = GpuUsable(o);
  in.banks = s.banks;
  if (cpu_dtype != s.layout.dtype) {
    const ExpertLayout packed{s.layout.d_model, s.layout.width, cpu_dtype};
    for (LayerBank& b : in.banks) {
      b.cpu_bytes = packed.bank_bytes(s.config.n_experts);
      b.cpu_dtype = cpu_dtype;
    }
  }
  in.budgets = budgets;
  in.cpu_layers = spec;
  in.ram_for_banks = RamForBanks(host);
  in.pack_pinned = (o.pack_pinned >= 0 ? o.pack_pinned : Tuning().pack_pinned.value_or(1)) != 0;
  return PlanResidency(in);
}

void LogWarnings(const std::vector<std::string>& warnings) {
  // Forty near-identical lines hide the one that matters: show a few, count the rest.
  constexpr size_t kShown = 3;
  for (size_t i = 0; i < warnings.size() && i < kShown; ++i) LogWarn(warnings[i]);
  if (warnings.size() > kShown)
    LogWarn("... and " + std::to_string(warnings.size() - kShown) +
            " more like these (see --report)");
}

// Whether the decoder runs on the GPU: gpu always (the plan fell back to cpu without one);
// offload, hybrid, and cpu as llama.cpp's --cpu-moe (dense parts and KV on the GPU, the experts
// on the CPU executor), when a GPU is usable.
bool RunsOnGpu(const ResidencyPlan& plan, const ResidencyOptions& o) {
  if (plan.backend == Backend::kGpu) return true;
  return (plan.backend == Backend::kOffload || plan.backend == Backend::kHybrid ||
          plan.backend == Backend::kCpu) &&
         GpuUsable(o);
}

// Dense matrices are held for the CPU (packed, copied) only when the CPU runs them: the GPU
// reads them as stored.
bool HoldsDense(const ResidencyPlan& plan, const ResidencyOptions& o) {
  return !RunsOnGpu(plan, o);
}

// Where the decoder runs, and on a GPU where each MoE layer's experts are: gpu copies them all
// to VRAM; offload caches the pinned layers' and leaves the rest (locked, or pinned that failed
// to pin and settled lower) to the CPU executor, as cpu does with every layer.
ComputeOptions ComputeFor(const ResidencyPlan& plan, const std::vector<LayerResidency>& settled,
                          const LoadOptions& options, int64_t n_layers) {
  ComputeOptions c;
  c.n_threads = options.n_threads;
  c.max_step_tokens = options.max_step_tokens;
  c.expert_cache_bytes = options.residency.expert_cache_bytes;
  c.staging_experts = options.residency.staging_experts;
  c.wrap = options.wrap_backend;
  if (!RunsOnGpu(plan, options.residency)) return c;
  c.device = ComputeDevice::kGpu;
  c.cuda_graphs = options.cuda_graphs && Tuning().cuda_graphs.value_or(1) != 0;
  c.stage_locked = options.stage_locked >= 0 ? options.stage_locked
                                             : static_cast<int>(Tuning().stage_locked.value_or(-1));
  if (plan.backend == Backend::kGpu) return c;  // every expert in VRAM
  c.split_misses = plan.backend == Backend::kHybrid;
  const ResidencyOptions& r = options.residency;
  c.fetch_share = r.fetch_share >= 0       ? r.fetch_share
                  : Tuning().fetch_percent ? static_cast<double>(*Tuning().fetch_percent) / 100.0
                                           : -1.0;
  c.expert_homes.assign(static_cast<size_t>(n_layers), ExpertHome::kCpuExecutor);
  for (const LayerResidency& l : settled)
    if (l.tier == Tier::kPinned)
      c.expert_homes[static_cast<size_t>(l.layer)] = ExpertHome::kGpuCache;
  return c;
}

// When a load reached each of its stages.
struct LoadTimes {
  std::chrono::steady_clock::time_point start, dense_checked, planned, banks_read, ready;
};

// Where a load's time went: the dense checksums (with the GPU starting beside them), the plan
// (waiting for the GPU), the expert banks, then the dense weights and the compute backend (on a
// GPU, the uploads).
std::string LoadTimesLine(const ModelSource& s, const LoadTimes& t) {
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  uint64_t bank_bytes = 0;
  for (const LayerBank& b : s.banks) bank_bytes += b.bytes;
  const double banks_s = secs(t.planned, t.banks_read);
  char line[280];
  std::snprintf(line, sizeof line,
                "load: %.2f s (dense checksums %.2f s; plan and GPU start %.2f s; expert banks "
                "%.2f GB in %.2f s, %.2f GB/s; dense weights and the backend %.2f s)",
                secs(t.start, t.ready), secs(t.start, t.dense_checked),
                secs(t.dense_checked, t.planned), static_cast<double>(bank_bytes) / 1e9, banks_s,
                banks_s > 0 ? static_cast<double>(bank_bytes) / 1e9 / banks_s : 0.0,
                secs(t.banks_read, t.ready));
  return line;
}

// The dense tensors a token reads one row of: the embedding table, unless it is the lm_head.
std::set<std::string> GatheredTensorNames(const ModelSource& s) {
  if (s.config.tie_word_embeddings) return {};
  return {std::string(s.spec->embedding_tensor_name)};
}

}  // namespace

Expected<ResidencyReport> PlanModelResidency(const std::filesystem::path& dir,
                                             const ResidencyOptions& options) {
  MT_ASSIGN_OR_RETURN(ModelSource s, OpenModelSource(dir));
  ResidencyReport r;
  MT_ASSIGN_OR_RETURN(r.plan, PlanFor(s, options));
  r.stored_dtype = s.layout.dtype;
  r.warnings = r.plan.warnings;
  r.vmlck_bytes = ReadVmLckBytes();
  return r;
}

Expected<std::unique_ptr<CausalLM>> LoadCausalLM(const std::filesystem::path& dir,
                                                 const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  MT_RETURN_IF_ERROR(ThreadPool::CheckThreadCount(options.n_threads, "--threads"));
  // The GPU starts while the dense weights are read and checked; the plan waits for it.
  std::future<bool> gpu_start;
  if (options.residency.use_gpu) gpu_start = std::async(std::launch::async, StartGpu);
  MT_ASSIGN_OR_RETURN(ModelSource s, OpenModelSource(dir));
  if (s.converted && options.residency.verify)
    MT_RETURN_IF_ERROR(s.converted->VerifyDenseChecksums());
  const auto t1 = std::chrono::steady_clock::now();
  ResidencyReport report;
  MT_ASSIGN_OR_RETURN(report.plan, PlanFor(s, options.residency));
  report.stored_dtype = s.layout.dtype;
  BankLoadOptions bank_options;
  bank_options.verify = options.residency.verify;
  bank_options.gpu_available = GpuUsable(options.residency);
  MT_ASSIGN_OR_RETURN(bank_options.inject, FailureInjectionFromEnv());
  if (Tuning().io_chunk_mib)
    bank_options.read_chunk_bytes = static_cast<size_t>(*Tuning().io_chunk_mib) << 20;
  if (options.before_weights) MT_RETURN_IF_ERROR(options.before_weights(s.config));
  LogWarnings(report.plan.warnings);
  const auto t_plan = std::chrono::steady_clock::now();

  const int io_threads = options.residency.n_io_threads > 0
                             ? options.residency.n_io_threads
                             : static_cast<int>(Tuning().io_threads.value_or(
                                   std::min(kDefaultIoThreads, ThreadPool::AvailableThreads())));
  ThreadPool io_pool(io_threads);
  // Packing and copying: every core this process may use, and only while the model loads.
  const bool packs = HoldsDense(report.plan, options.residency) ||
                     std::any_of(report.plan.layers.begin(), report.plan.layers.end(),
                                 [&](const LayerResidency& l) {
                                   return l.dtype != s.layout.dtype || l.has_cpu_copy();
                                 });
  ThreadPool pack_pool(packs ? ThreadPool::DefaultThreads() : 1);
  MT_ASSIGN_OR_RETURN(LoadedBanks banks,
                      LoadBanks(s, report.plan, bank_options, io_pool, pack_pool));
  const auto t2 = std::chrono::steady_clock::now();
  LogWarnings(banks.warnings);

  report.settled = banks.settled;
  report.warnings = report.plan.warnings;
  report.warnings.insert(report.warnings.end(), banks.warnings.begin(), banks.warnings.end());
  report.vmlck_bytes = ReadVmLckBytes();
  report.read_mode = banks.read_mode;
  if (report.plan.backend != Backend::kGpu)  // gpu's go to VRAM first (ReportHeldInVram)
    for (const auto& line : TierSummaryLines(*report.settled)) LogInfo("experts " + line);

  const ModelConfig config = s.config;
  std::unique_ptr<TensorStore> dense = s.TakeDense();
  if (HoldsDense(report.plan, options.residency)) {
    DenseHoldingOptions held;
    held.packing = options.residency.packing;
    held.memory = options.residency.dense_memory;
    held.available_bytes = ReadHostMemoryInfo().available_bytes;
    held.skip = ExpertTensorNames(s);  // a checkpoint's experts: in banks
    held.keep_dtype = RouterTensorNames(s);
    held.gathered = GatheredTensorNames(s);
    const auto t3 = std::chrono::steady_clock::now();
    MT_ASSIGN_OR_RETURN(DenseHolding d, HoldDenseWeights(std::move(dense), held, pack_pool));
    dense = std::move(d.store);
    LogWarnings(d.warnings);
    report.warnings.insert(report.warnings.end(), d.warnings.begin(), d.warnings.end());
    report.dense = DenseReport{d.n_packed, d.n_copied, d.bytes_after + d.copied_bytes,
                               d.copies ? "copy" : "mapped"};
    if (d.n_packed > 0 || d.n_copied > 0) {
      char line[200];
      std::string what;
      if (d.n_packed > 0) {
        std::snprintf(line, sizeof line, "%d matrices packed as BF16C (%.2f -> %.2f GB)",
                      d.n_packed, static_cast<double>(d.bytes_before) / 1e9,
                      static_cast<double>(d.bytes_after) / 1e9);
        what = line;
      }
      if (d.n_copied > 0) {
        std::snprintf(line, sizeof line, "%d copied from the file mapping (%.2f GB)", d.n_copied,
                      static_cast<double>(d.copied_bytes) / 1e9);
        what += (what.empty() ? "" : ", ") + std::string(line);
      }
      std::snprintf(line, sizeof line, " (%.1f s)",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t3).count());
      LogInfo("dense: " + what + line);
    }
    if (!d.copies && options.residency.dense_memory == DenseMemory::kAuto)
      LogInfo(
          "dense: matrices read from the file mapping: too little RAM available to copy "
          "them (--dense-memory copy forces it)");
  }
  const ComputeOptions compute = ComputeFor(report.plan, *report.settled, options, config.n_layers);
  MT_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model,
                      s.spec->create(config, std::move(dense), std::move(banks.experts), compute));
  if (report.plan.backend == Backend::kGpu) {  // the banks were copied to VRAM by the backend
    ReportHeldInVram(s, report.plan.layers);
    ReportHeldInVram(s, *report.settled);
    for (const auto& line : TierSummaryLines(*report.settled)) LogInfo("experts " + line);
  }
  LogInfo(LoadTimesLine(s, {t0, t1, t_plan, t2, std::chrono::steady_clock::now()}));
  model->set_residency(std::move(report));
  return model;
}

}  // namespace moetier
