#include "backend/cuda/expert_offload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>

#include "backend/cpu/cpu_backend.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/tuning.h"
#include "experts/expert_layout.h"
#include "kernels/cuda/bf16c_expand.h"
#include "kernels/cuda/cuda_check.h"

namespace moetier {

namespace {

// VRAM the default cache leaves free: buffers regrown for a longer step than any before,
// cuBLAS's workspace, the CUDA context's own allocations.
constexpr uint64_t kWorkspaceReserveBytes = uint64_t{1} << 30;
// Slots start on this boundary: the expert kernels' 16-byte loads and whole cache lines.
constexpr uint64_t kSlotAlignment = 256;
// The prefill crossover: a step streams whole banks when it has at least
//  - kStreamAssignmentsPerExpert (token, expert) assignments per expert (tokens * top-k /
//    experts): about 86 % of a layer's experts are then active with uniform routing (1 - e^-2),
//    so a bank copies little that the cache path would not; and
//  - kStreamTokensPerBankGb tokens per GB of one layer's copied bank: enough compute per layer
//    to hide the next bank's copy behind. Measured on an H100 (PCIe Gen5, 8-layer Qwen3-30B-A3B
//    shape, smallest cache; prefill tokens/s streamed / through the cache): q4_0 (0.34 GB a
//    layer) 10.2k / 12.3k at 512 tokens, 20.4k / 20.1k at 1,024, 40.2k / 29.5k at 2,048; bf16
//    pinned as bf16c (0.93 GB) 6.8k / 8.3k at 1,024, 13.5k / 13.6k at 2,048, 26.3k / 19.7k at
//    4,096. Below the crossover the cache path wins by its hits and by not copying the experts a
//    step leaves unused.
// MOETIER_STREAM_MIN_TOKENS replaces the rule.
constexpr int64_t kStreamAssignmentsPerExpert = 2;
constexpr double kStreamTokensPerBankGb = 2000.0;
// Hybrid splits a step's misses while it has at most this many (token, expert) assignments per
// expert of the layer (tokens * top-k / experts): decode steps of up to 64 sequences with
// Qwen3-30B-A3B's 128 experts and top-8. The CPU executor's time per expert then follows its
// bytes, which the split's rates assume; larger steps copy every miss (their experts have many
// tokens each: the GPU computes them far faster).
constexpr double kSplitMaxAssignmentsPerExpert = 4.0;
// Packed (BF16C) misses are expanded on their own stream a group at a time, while the copy
// engine goes on with the next ones: a group's expansion (~5 µs an expert) then overlaps the
// copies after it, and only the last group's is left when a layer's copies end.
constexpr size_t kExpandGroup = 4;
// Where VRAM cannot hold a layer's packed experts beside the stream buffers, packed misses are
// staged this many at a time (a layer's misses of two sequences at top-8), each wave's copies
// waiting for the expansion of the one before.
constexpr int64_t kShortStagingExperts = 16;

// Whether the GPU computes experts held as `t`: as stored, or expanded from BF16C.
bool GpuComputesDType(DType t) {
  const DType c = cuda::GpuDType(t);
  return c == DType::kBF16 || c == DType::kQ8_0 || c == DType::kQ4_0;
}

std::string Gb(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return s;
}

// Whether an expert's gate, up and down lie back to back, as banks lay them out: one copy each.
bool OneRange(const ExpertWeights& w) {
  const auto* gate = static_cast<const uint8_t*>(w.gate.data);
  return w.up.data == gate + w.gate.n_bytes && w.down.data == gate + w.gate.n_bytes + w.up.n_bytes;
}

uint64_t BytesOf(const ExpertWeights& w) {
  return w.gate.n_bytes + w.up.n_bytes + w.down.n_bytes;
}

}  // namespace

Status ExpertOffload::LayerStatus(cudaError_t err, const char* action, int64_t layer,
                                  const char* object) {
  if (err == cudaSuccess) return OkStatus();
  return cuda::CudaStatus(err, std::string(action) + " layer " + std::to_string(layer) + object);
}

ExpertOffload::ExpertOffload(const ExpertSource& experts, const ModelDims& dims)
    : experts_(experts), dims_(dims) {}

ExpertOffload::~ExpertOffload() {
  SaveSplitRates();
  if (cpu_worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(cpu_mu_);
      cpu_stop_ = true;
    }
    cpu_cv_.notify_one();
    cpu_worker_.join();
  }
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (expand_stream_ != nullptr) {
    cudaStreamSynchronize(expand_stream_);
    cudaStreamDestroy(expand_stream_);
  }
  if (copied_ != nullptr) cudaEventDestroy(copied_);
  if (expanded_ != nullptr) cudaEventDestroy(expanded_);
  if (staged_ != nullptr) cudaEventDestroy(staged_);
  if (stream_ready_ != nullptr) cudaEventDestroy(stream_ready_);
  for (cudaEvent_t e : copy_start_) cudaEventDestroy(e);
  for (cudaEvent_t e : copy_end_) cudaEventDestroy(e);
}

Expected<std::unique_ptr<ExpertOffload>> ExpertOffload::Create(const ComputeOptions& options,
                                                               const ExpertSource& experts,
                                                               const ModelDims& dims) {
  std::unique_ptr<ExpertOffload> o(new ExpertOffload(experts, dims));
  o->homes_ = options.expert_homes;
  o->homes_.resize(static_cast<size_t>(dims.n_layers), ExpertHome::kVram);
  o->requested_cache_bytes_ = options.expert_cache_bytes;
  o->requested_staging_experts_ = options.staging_experts;
  const int64_t E = dims.n_experts;
  bool cpu_layers = false;
  o->packed_.assign(static_cast<size_t>(dims.n_layers), false);
  for (int64_t layer : dims.moe_layers) {
    if (o->home(layer) == ExpertHome::kCpuExecutor) cpu_layers = true;
    if (o->home(layer) != ExpertHome::kGpuCache) continue;
    MT_RETURN_IF_ERROR(o->CheckCachedLayer(layer));
    o->cached_bytes_ += o->expert_bytes_ * static_cast<uint64_t>(E);
    ++o->n_cached_layers_;
  }
  o->stageable_.assign(static_cast<size_t>(dims.n_layers), false);
  if (options.stage_locked != 0) o->FindStageableLayers();
  if (o->has_stageable_)
    o->locked_prefill_ = std::make_unique<LockedPrefill>(
        options.stage_locked == 1 ? std::optional(LockedPrefill::Way::kStage) : std::nullopt);
  o->slot_stride_ = (o->expert_bytes_ + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  const int64_t routed_enough =
      (kStreamAssignmentsPerExpert * E + dims.top_k - 1) / std::max<int64_t>(1, dims.top_k);
  const uint64_t copied_bytes = o->packed_bytes_ != 0 ? o->packed_bytes_ : o->expert_bytes_;
  const auto compute_enough = static_cast<int64_t>(
      std::ceil(kStreamTokensPerBankGb * static_cast<double>(copied_bytes * E) / 1e9));
  o->stream_min_tokens_ =
      Tuning().stream_min_tokens.value_or(std::max<int64_t>({1, routed_enough, compute_enough}));
  if (o->has_cached_layers() || o->has_stageable_) {
    MT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&o->copy_stream_, cudaStreamNonBlocking),
                            "creating the expert copy stream");
    MT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&o->copied_, cudaEventDisableTiming),
                            "creating the expert copy event");
    MT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&o->stream_ready_, cudaEventDisableTiming),
                            "creating the expert stream event");
    if (o->packed_bytes_ != 0) MT_RETURN_IF_ERROR(o->CreateExpandStream());
    for (int64_t l = 0; l < dims.n_layers; ++l)
      for (auto* events : {&o->copy_start_, &o->copy_end_}) {
        cudaEvent_t e = nullptr;
        MT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e), "creating the expert copy timing events");
        events->push_back(e);
      }
    o->timed_layers_.reserve(static_cast<size_t>(dims.n_layers));
    MT_RETURN_IF_ERROR(o->routing_host_.Reserve(static_cast<size_t>(1 + E), "the routing"));
    MT_RETURN_IF_ERROR(o->table_host_.Reserve(static_cast<size_t>(dims.n_layers * E),
                                              "the expert cache's tables"));
  }
  o->split_ = options.split_misses && o->has_cached_layers();
  if (o->split_) {
    const int64_t first_cached =
        *std::find_if(dims.moe_layers.begin(), dims.moe_layers.end(),
                      [&](int64_t layer) { return o->home(layer) == ExpertHome::kGpuCache; });
    o->MakeSplitModel(options, experts.Expert(first_cached, 0).gate.dtype,
                      experts.CpuExpert(first_cached, 0).gate.dtype);
    o->step_cpu_experts_.assign(static_cast<size_t>(dims.n_layers), 0);
  }
  o->timed_experts_.assign(static_cast<size_t>(dims.n_layers), 0);
  if (cpu_layers || o->split_) o->StartCpuSide(options.n_threads);
  return o;
}

std::string ExpertOffload::FetchableBank(int64_t layer, BankShape& shape) const {
  const ExpertWeights& w0 = experts_.Expert(layer, 0);
  shape.packed = w0.gate.dtype == DType::kBF16C;
  shape.bytes = BytesOf(w0);
  // In a slot, as the GPU computes them.
  const ExpertLayout slot{w0.gate.dim(1), w0.gate.dim(0), cuda::GpuDType(w0.gate.dtype)};
  shape.computed = slot.dtype;
  shape.slot_bytes = slot.expert_bytes();
  shape.gate_up_bytes = slot.gate_up_bytes();
  if (!GpuComputesDType(w0.gate.dtype))
    return " are " + std::string(DTypeName(w0.gate.dtype)) +
           ": the GPU reads bf16, bf16c, q8_0 or q4_0 experts";
  for (int64_t e = 0; e < dims_.n_experts; ++e) {
    const ExpertWeights& w = experts_.Expert(layer, e);
    if (!OneRange(w)) return " are not stored as one range per expert (a bank)";
    if (w.gate.dtype != w0.gate.dtype || BytesOf(w) != shape.bytes)
      return " differ from each other in dtype or size";
  }
  return "";
}

std::string ExpertOffload::FitsOtherBanks(const BankShape& shape) const {
  if (expert_bytes_ != 0 && shape.slot_bytes != expert_bytes_)
    return " differ in size from the other GPU-run layers'";
  if (shape.packed && packed_bytes_ != 0 && shape.bytes != packed_bytes_)
    return " differ in size from the other packed layers'";
  return "";
}

void ExpertOffload::NoteBank(int64_t layer, const BankShape& shape) {
  expert_bytes_ = shape.slot_bytes;
  gate_bytes_ = up_bytes_ = shape.gate_up_bytes;
  if (!shape.packed) return;
  packed_bytes_ = shape.bytes;
  packed_[static_cast<size_t>(layer)] = true;
}

Status ExpertOffload::CheckCachedLayer(int64_t layer) {
  BankShape shape;
  std::string why = FetchableBank(layer, shape);
  if (why.empty()) why = FitsOtherBanks(shape);
  if (!why.empty()) return Status::Error("the experts of layer " + std::to_string(layer) + why);
  NoteBank(layer, shape);
  return OkStatus();
}

Status ExpertOffload::CreateExpandStream() {
  MT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&expand_stream_, cudaStreamNonBlocking),
                          "creating the expansion stream of packed experts");
  for (cudaEvent_t* e : {&expanded_, &staged_})
    MT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming),
                            "creating the expansion events of packed experts");
  staging_stride_ = AlignUp(packed_bytes_, kBankAlignment);
  return OkStatus();
}

void ExpertOffload::FindStageableLayers() {
  DType dtype = DType::kF32;  // what the GPU computes the cached layers' experts as
  for (int64_t layer : dims_.moe_layers)
    if (home(layer) == ExpertHome::kGpuCache) {
      dtype = cuda::GpuDType(experts_.Expert(layer, 0).gate.dtype);
      break;
    }
  for (int64_t layer : dims_.moe_layers) {
    if (home(layer) != ExpertHome::kCpuExecutor) continue;
    BankShape shape;
    if (!FetchableBank(layer, shape).empty() || !FitsOtherBanks(shape).empty()) continue;
    if (dtype != DType::kF32 && shape.computed != dtype) continue;
    NoteBank(layer, shape);
    dtype = shape.computed;
    stageable_[static_cast<size_t>(layer)] = true;
    has_stageable_ = true;
  }
}

void ExpertOffload::MakeSplitModel(const ComputeOptions& options, DType dtype, DType cpu_dtype) {
  std::optional<SplitRates> start;
  if (options.fetch_share < 0) {
    cudaDeviceProp prop{};
    const std::string gpu =
        cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "unknown GPU";
    const int threads = options.n_threads > 0 ? options.n_threads : ThreadPool::DefaultThreads();
    // The CPU's rate depends on the format it reads: a CPU copy's (residency_plan.h) is its own.
    const std::string formats =
        std::string(DTypeName(dtype)) +
        (cpu_dtype != dtype ? "/cpu " + std::string(DTypeName(cpu_dtype)) : "");
    split_key_ = SplitProfileKey(gpu, formats, expert_bytes_, threads);
    split_profile_ = SplitProfilePath();
  }
  if (!split_profile_.empty()) {
    Expected<std::optional<SplitRates>> kept = LoadSplitRates(split_profile_, split_key_);
    if (!kept.ok()) {
      LogWarn("hybrid: " + kept.message() + "; the split starts even");
    } else if (*kept) {
      start = **kept;
      const double q =
          start->cpu_ns_per_expert / (start->copy_ns_per_expert + start->cpu_ns_per_expert);
      LogInfo("hybrid: the split starts at q* " + std::to_string(q).substr(0, 4) +
              ", as measured by an earlier run (" + split_profile_.string() + ")");
    }
  }
  split_model_ = std::make_unique<MissSplit>(expert_bytes_, options.fetch_share, start);
}

void ExpertOffload::SaveSplitRates() const {
  if (split_model_ == nullptr || split_profile_.empty()) return;
  const std::optional<SplitRates> rates = split_model_->MeasuredRates();
  if (!rates) return;
  if (Status s = moetier::SaveSplitRates(split_profile_, split_key_, *rates); !s.ok())
    LogWarn("hybrid: the measured split was not kept: " + s.message());
}

Status ExpertOffload::AllocateCache() {
  if (cache_allocated() || (!has_cached_layers() && !has_stageable_)) return OkStatus();
  const int64_t E = dims_.n_experts;
  bool caches_packed = false;
  for (int64_t layer : dims_.moe_layers)
    caches_packed |= home(layer) == ExpertHome::kGpuCache && packed_[static_cast<size_t>(layer)];
  const uint64_t min_bytes = slot_stride_ * static_cast<uint64_t>(E);  // a step may use them all
  const uint64_t all_bytes = min_bytes * static_cast<uint64_t>(n_cached_layers_);
  // The stream buffers (with a staging buffer of a layer's packed experts, which streamed and
  // staged packed banks go through) first, when the VRAM left after them still holds the
  // smallest cache; else prefill takes the cache path, with a notice, and packed misses are
  // staged a few at a time.
  const uint64_t stream_bytes = 2 * min_bytes;
  const uint64_t layer_staging = packed_bytes_ != 0 ? staging_stride_ * E : 0;
  const bool whole_layer_staging =
      requested_staging_experts_ <= 0 || requested_staging_experts_ >= E;
  {
    size_t free = 0, total = 0;
    MT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total), "reading the free VRAM");
    const uint64_t cache_bytes = !has_cached_layers()          ? 0
                                 : requested_cache_bytes_ != 0 ? requested_cache_bytes_
                                                               : min_bytes;
    const uint64_t need = stream_bytes + layer_staging + kWorkspaceReserveBytes + cache_bytes;
    if (whole_layer_staging && free >= need) {
      MT_ASSIGN_OR_RETURN(stream_buf_,
                          cuda::DeviceBuffer<uint8_t>::Create(stream_bytes, "the stream buffers"));
      if (layer_staging != 0) MT_RETURN_IF_ERROR(AllocateStaging(E));
    } else {
      LogInfo(std::string(whole_layer_staging ? "gpu: no VRAM for" : "gpu: without") +
              " the prefill stream buffers (" + Gb(stream_bytes + layer_staging) +
              "); long prompts copy experts through the cache");
      if (caches_packed)
        MT_RETURN_IF_ERROR(
            AllocateStaging(std::min(E, requested_staging_experts_ > 0 ? requested_staging_experts_
                                                                       : kShortStagingExperts)));
    }
  }
  allocated_ = true;
  if (has_stageable_ && stream_buf_.size() > 0) {
    Expected<std::unique_ptr<cuda::StagingRing>> ring = cuda::StagingRing::Create();
    if (ring.ok())
      ring_ = std::move(*ring);
    else
      LogInfo("gpu: " + ring.message() + "; locked layers' prefill stays on the CPU executor");
  }
  if (!has_cached_layers()) return OkStatus();
  uint64_t bytes = requested_cache_bytes_;
  if (bytes != 0) {
    if (bytes < min_bytes)
      return Status::Error("--moe-cache-gb: " + Gb(bytes) + " holds less than one layer's " +
                           std::to_string(E) + " experts (" + Gb(min_bytes) +
                           "), which one step may need; give at least that");
  } else {
    size_t free = 0, total = 0;
    MT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total), "reading the free VRAM");
    const uint64_t usable = free > kWorkspaceReserveBytes ? free - kWorkspaceReserveBytes : 0;
    if (usable < min_bytes)
      return Status::Error(
          "the GPU expert cache needs at least one layer's experts (" + Gb(min_bytes) + "), but " +
          Gb(usable) +
          " of VRAM is free after the weights, the KV cache and the workspace; lower --ctx-size "
          "or --kv-cache-gb, or put more layers on the CPU (--moe-cpu-layers)");
    bytes = usable;
  }
  bytes = std::min(bytes, all_bytes);
  const int64_t n_slots = static_cast<int64_t>(bytes / slot_stride_);
  MT_ASSIGN_OR_RETURN(
      cache_, cuda::DeviceBuffer<uint8_t>::Create(static_cast<size_t>(n_slots) * slot_stride_,
                                                  "the GPU expert cache (lower --moe-cache-gb)"));
  slots_ = std::make_unique<ExpertSlots>(n_slots, dims_.n_layers, E,
                                         Tuning().cache_lru.value_or(0) != 0
                                             ? ExpertSlots::Eviction::kLeastRecent
                                             : ExpertSlots::Eviction::kLayerOrder);
  if (split_) {
    MT_ASSIGN_OR_RETURN(zero_slot_, cuda::DeviceBuffer<uint8_t>::Create(
                                        slot_stride_, "the hybrid split's zero expert"));
    MT_CUDA_RETURN_IF_ERROR(cudaMemset(zero_slot_.data(), 0, zero_slot_.bytes()),
                            "zeroing the hybrid split's zero expert");
  }
  LogInfo("gpu: expert cache of " + std::to_string(n_slots) + " experts (" + Gb(cache_.bytes()) +
          ", " +
          (requested_cache_bytes_ != 0 ? std::string("--moe-cache-gb") : "auto: the free VRAM") +
          ") for " + std::to_string(n_cached_layers_) + " layer(s) of pinned experts (" +
          Gb(cached_bytes_) + ")" +
          (stream_buf_.size() > 0 ? "; steps of " + std::to_string(stream_min_tokens_) +
                                        "+ tokens stream whole banks through two buffers (" +
                                        Gb(stream_buf_.bytes()) + ")"
                                  : "") +
          (staging_.size() > 0
               ? "; bf16c banks copied packed through " + Gb(staging_.bytes()) + " and expanded"
               : ""));
  return OkStatus();
}

Status ExpertOffload::BeginStep(int64_t n_tokens, cudaStream_t compute) {
  if (!has_cached_layers() && !has_stageable_) return OkStatus();
  if (!cache_allocated()) MT_RETURN_IF_ERROR(AllocateCache());
  stream_layer_[0] = stream_layer_[1] = -1;
  const bool long_step = stream_buf_.size() > 0 && n_tokens >= stream_min_tokens_;
  stage_step_ = long_step && ring_ != nullptr &&
                locked_prefill_->Choose(n_tokens) == LockedPrefill::Way::kStage;
  streaming_ = long_step && (has_cached_layers() || stage_step_);
  split_step_ = split_ && !streaming_ &&
                static_cast<double>(n_tokens * dims_.top_k) <=
                    kSplitMaxAssignmentsPerExpert * static_cast<double>(dims_.n_experts);
  std::fill(step_cpu_experts_.begin(), step_cpu_experts_.end(), 0);
  if (!streaming_) return OkStatus();
  const int64_t first = NextStreamedLayer(-1);
  return first >= 0 ? StreamBank(first, 0, compute) : OkStatus();
}

int64_t ExpertOffload::NextStreamedLayer(int64_t layer) const {
  for (int64_t l : dims_.moe_layers)
    if (l > layer && Fetches(l)) return l;
  return -1;
}

Status ExpertOffload::TimeCopies(int64_t layer, bool start, int64_t n_experts) {
  if (stats_ == nullptr && !split_ && times_ == nullptr) return OkStatus();
  const auto l = static_cast<size_t>(layer);
  MT_CUDA_RETURN_IF_ERROR(cudaEventRecord(start ? copy_start_[l] : copy_end_[l], copy_stream_),
                          "timing the copies");
  if (!start) {
    timed_layers_.push_back(layer);
    timed_experts_[l] = n_experts;
  }
  return OkStatus();
}

Status ExpertOffload::AllocateStaging(int64_t n_experts) {
  MT_ASSIGN_OR_RETURN(staging_, cuda::DeviceBuffer<uint8_t>::Create(
                                    staging_stride_ * static_cast<uint64_t>(n_experts),
                                    "the packed experts' staging buffer (--weight-packing none "
                                    "keeps pinned banks as stored, without it)"));
  staging_experts_ = n_experts;
  return OkStatus();
}

Expected<ExpertOffload::BankTarget> ExpertOffload::TargetOf(int64_t layer, uint8_t* dst) {
  if (!packed_[static_cast<size_t>(layer)]) return BankTarget{dst, expert_bytes_, slot_stride_};
  MT_RETURN_IF_ERROR(WaitForStaging());
  return BankTarget{staging_.data(), packed_bytes_, staging_stride_};
}

Status ExpertOffload::StreamBank(int64_t layer, int b, cudaStream_t compute) {
  MT_CUDA_RETURN_IF_ERROR(cudaEventRecord(stream_ready_, compute), "ordering the bank copy");
  MT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, stream_ready_, 0),
                          "ordering the bank copy");
  const int64_t E = dims_.n_experts;
  uint8_t* dst = stream_buf_.data() + static_cast<uint64_t>(b) * slot_stride_ * E;
  stream_layer_[b] = layer;
  if (home(layer) == ExpertHome::kCpuExecutor) return StageBank(layer, dst);
  const bool packed = packed_[static_cast<size_t>(layer)];
  MT_ASSIGN_OR_RETURN(const BankTarget t, TargetOf(layer, dst));
  const auto* first = static_cast<const uint8_t*>(experts_.Expert(layer, 0).gate.data);
  // One copy when the bank holds its experts back to back at the destination's stride; else one
  // each.
  bool one_range = t.bytes == t.stride || packed;
  for (int64_t e = 1; one_range && e < E; ++e)
    one_range = experts_.Expert(layer, e).gate.data == first + e * t.stride;
  MT_RETURN_IF_ERROR(TimeCopies(layer, true));
  if (one_range) {
    MT_RETURN_IF_ERROR(LayerStatus(cudaMemcpyAsync(t.to, first, t.stride * (E - 1) + t.bytes,
                                                   cudaMemcpyHostToDevice, copy_stream_),
                                   "streaming", layer, "'s bank to the GPU"));
  } else {
    for (int64_t e = 0; e < E; ++e)
      MT_RETURN_IF_ERROR(
          LayerStatus(cudaMemcpyAsync(t.to + e * t.stride, experts_.Expert(layer, e).gate.data,
                                      t.bytes, cudaMemcpyHostToDevice, copy_stream_),
                      "streaming", layer, "'s bank to the GPU"));
  }
  MT_RETURN_IF_ERROR(TimeCopies(layer, false, E));
  if (packed) MT_RETURN_IF_ERROR(ExpandInto(layer, dst));
  LayerExpertStats d;
  d.layer = layer;
  d.cache_misses = d.fetched_experts = E;
  d.bytes_h2d = static_cast<int64_t>(t.bytes) * E;
  if (stats_ != nullptr) stats_->Add(d);
  return OkStatus();
}

Status ExpertOffload::StageBank(int64_t layer, uint8_t* dst) {
  const int64_t E = dims_.n_experts;
  const bool packed = packed_[static_cast<size_t>(layer)];
  MT_ASSIGN_OR_RETURN(const BankTarget t, TargetOf(layer, dst));
  stage_ranges_.clear();
  for (int64_t e = 0; e < E; ++e)
    stage_ranges_.push_back(cuda::StagingRing::Range{experts_.Expert(layer, e).gate.data,
                                                     t.to + e * t.stride, t.bytes});
  const auto t0 = std::chrono::steady_clock::now();
  MT_RETURN_IF_ERROR(ring_->Copy(stage_ranges_, copy_stream_, &cpu_->pool()));
  const std::chrono::duration<double, std::nano> ns = std::chrono::steady_clock::now() - t0;
  if (packed) MT_RETURN_IF_ERROR(ExpandInto(layer, dst));
  locked_prefill_->ObserveStage(ns.count());
  if (times_ != nullptr) (*times_)[Phase::kCopies] += ns.count() * 1e-9;
  LayerExpertStats d;
  d.layer = layer;
  d.cache_misses = d.fetched_experts = E;
  d.bytes_h2d = static_cast<int64_t>(t.bytes) * E;
  d.h2d_ns = static_cast<int64_t>(ns.count());  // the staging's wall time: its effective rate
  if (stats_ != nullptr) stats_->Add(d);
  return OkStatus();
}

Status ExpertOffload::PublishTable(int64_t layer, cuda::ExpertPointers* device_table,
                                   cudaStream_t compute) {
  const int64_t E = dims_.n_experts;
  MT_RETURN_IF_ERROR(
      LayerStatus(cudaMemcpyAsync(device_table, table_host_.data() + layer * E,
                                  static_cast<size_t>(E) * sizeof(cuda::ExpertPointers),
                                  cudaMemcpyHostToDevice, copy_stream_),
                  "copying", layer, "'s expert table"));
  MT_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_, copy_stream_), "recording the copies");
  MT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, copied_, 0), "waiting for the copies");
  if (expanded_ != nullptr)  // (an expansion that finished long ago costs the wait nothing)
    MT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, expanded_, 0),
                            "waiting for the packed experts' expansion");
  return OkStatus();
}

Status ExpertOffload::FetchStreamed(int64_t layer, cuda::ExpertPointers* device_table,
                                    cudaStream_t compute) {
  int b = stream_layer_[0] == layer ? 0 : stream_layer_[1] == layer ? 1 : -1;
  if (b < 0) {  // not queued ahead (the first layer, or an order the prefetch did not foresee)
    b = stream_layer_[0] < 0 || stream_layer_[0] < layer ? 0 : 1;
    MT_RETURN_IF_ERROR(StreamBank(layer, b, compute));
  }
  const int64_t E = dims_.n_experts;
  uint8_t* base = stream_buf_.data() + static_cast<uint64_t>(b) * slot_stride_ * E;
  cuda::ExpertPointers* staged = table_host_.data() + layer * E;
  for (int64_t e = 0; e < E; ++e) {
    uint8_t* slot = base + e * slot_stride_;
    staged[e] = SlotPointers(slot);
  }
  MT_RETURN_IF_ERROR(PublishTable(layer, device_table, compute));
  // The other buffer's reader (the previous cached layer's FFN) is queued on compute already.
  const int64_t next = NextStreamedLayer(layer);
  return next >= 0 ? StreamBank(next, 1 - b, compute) : OkStatus();
}

Status ExpertOffload::ReadRouting(int64_t layer, const cuda::DeviceRouting& r, const float* x,
                                  bool whole, cudaStream_t compute) {
  const int64_t E = dims_.n_experts;
  // n_active, the active ids, begin and token_of sit together at the start of the routing's
  // integers (cuda_backend.cpp lays them out).
  const int64_t n_ints = whole ? 1 + E + (E + 1) + r.n_assignments() : 1 + E;
  if (routing_host_.size() < static_cast<size_t>(n_ints)) {
    MT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute), "the GPU before reading a routing");
    MT_RETURN_IF_ERROR(routing_host_.Reserve(static_cast<size_t>(n_ints), "the routing"));
    MT_RETURN_IF_ERROR(
        weights_host_.Reserve(static_cast<size_t>(r.n_assignments()), "the routing"));
    ++buffer_generation_;
  }
  if (!replaying()) MT_RETURN_IF_ERROR(QueueRoutingRead(layer, r, x, whole, n_ints, compute));
  PauseSegment();
  {
    ScopedPhase wait(times_, Phase::kGpuWait);
    MT_RETURN_IF_ERROR(
        LayerStatus(cudaStreamSynchronize(compute), "the GPU before", layer, "'s experts"));
  }
  MT_RETURN_IF_ERROR(SettleCpuShare());
  const int32_t* ids = routing_host_.data() + 1;
  const int32_t n_active = routing_host_.data()[0];
  if (n_active < 0 || n_active > E)
    return Status::Error("the GPU router reported " + std::to_string(n_active) + " experts");
  for (int32_t a = 0; a < n_active; ++a)
    if (ids[a] < 0 || ids[a] >= E)
      return Status::Error("the GPU router chose no expert " + std::to_string(ids[a]));
  return OkStatus();
}

Status ExpertOffload::QueueRoutingRead(int64_t layer, const cuda::DeviceRouting& r, const float* x,
                                       bool whole, int64_t n_ints, cudaStream_t compute) {
  MT_RETURN_IF_ERROR(LayerStatus(cudaMemcpyAsync(routing_host_.data(), r.n_active,
                                                 static_cast<size_t>(n_ints) * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, compute),
                                 "reading the routing of", layer, "'s experts"));
  if (whole) {
    MT_RETURN_IF_ERROR(
        LayerStatus(cudaMemcpyAsync(weights_host_.data(), r.weight_of,
                                    static_cast<size_t>(r.n_assignments()) * sizeof(float),
                                    cudaMemcpyDeviceToHost, compute),
                    "reading the routing of", layer, "'s experts"));
    MT_RETURN_IF_ERROR(
        LayerStatus(cudaMemcpyAsync(x_host_.data(), x,
                                    static_cast<size_t>(r.n_tokens * dims_.d_model) * sizeof(float),
                                    cudaMemcpyDeviceToHost, compute),
                    "copying", layer, "'s hidden states to the host"));
  }
  return OkStatus();
}

Status ExpertOffload::CopyExpert(int64_t layer, int32_t expert, uint8_t* slot) {
  const void* from = experts_.Expert(layer, expert).gate.data;
  if (!packed_[static_cast<size_t>(layer)])
    return LayerStatus(
        cudaMemcpyAsync(slot, from, expert_bytes_, cudaMemcpyHostToDevice, copy_stream_), "copying",
        layer, "'s experts to the GPU");
  if (n_staged_ == staging_experts_) MT_RETURN_IF_ERROR(ExpandStaged(layer));  // a new wave
  if (n_staged_ == 0) MT_RETURN_IF_ERROR(WaitForStaging());
  uint8_t* staged = staging_.data() + static_cast<uint64_t>(n_staged_++) * staging_stride_;
  MT_RETURN_IF_ERROR(LayerStatus(
      cudaMemcpyAsync(staged, from, packed_bytes_, cudaMemcpyHostToDevice, copy_stream_), "copying",
      layer, "'s experts to the GPU"));
  expansions_.push_back({staged, slot});
  return expansions_.size() == kExpandGroup ? QueueExpansions(layer) : OkStatus();
}

Status ExpertOffload::WaitForStaging() {
  MT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, expanded_, 0),
                          "ordering the packed experts' copies");
  return OkStatus();
}

Status ExpertOffload::QueueExpansions(int64_t layer) {
  if (expansions_.empty()) return OkStatus();
  MT_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_, copy_stream_), "recording the staged experts");
  MT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(expand_stream_, staged_, 0),
                          "ordering the packed experts' expansion");
  cuda::LaunchExpandBf16c(expansions_, dims_.d_model, dims_.expert_width, expand_stream_);
  expansions_.clear();
  return LayerStatus(cudaGetLastError(), "expanding", layer, "'s packed experts");
}

Status ExpertOffload::ExpandInto(int64_t layer, uint8_t* dst) {
  for (int64_t e = 0; e < dims_.n_experts; ++e)
    expansions_.push_back({staging_.data() + e * staging_stride_, dst + e * slot_stride_});
  return ExpandStaged(layer);
}

Status ExpertOffload::ExpandStaged(int64_t layer) {
  MT_RETURN_IF_ERROR(QueueExpansions(layer));
  n_staged_ = 0;
  MT_CUDA_RETURN_IF_ERROR(cudaEventRecord(expanded_, expand_stream_),
                          "recording the packed experts' expansion");
  return OkStatus();
}

Status ExpertOffload::Fetch(int64_t layer, const cuda::DeviceRouting& r, const float* x,
                            cuda::ExpertPointers* device_table, cudaStream_t compute) {
  if (!cache_allocated()) MT_RETURN_IF_ERROR(AllocateCache());
  if (streaming_) return FetchStreamed(layer, device_table, compute);
  if (split_step_) return FetchSplit(layer, r, x, device_table, compute);
  MT_RETURN_IF_ERROR(ReadRouting(layer, r, x, /*whole=*/false, compute));
  const std::span<const int32_t> ids(routing_host_.data() + 1,
                                     static_cast<size_t>(routing_host_.data()[0]));
  if (!slots_->Place(layer, ids, placed_))
    return Status::Error("layer " + std::to_string(layer) +
                         "'s experts: more active experts than cache slots");
  cuda::ExpertPointers* staged = table_host_.data() + layer * dims_.n_experts;
  LayerExpertStats d;
  d.layer = layer;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint8_t* slot = cache_.data() + static_cast<uint64_t>(placed_[i].slot) * slot_stride_;
    if (placed_[i].hit) {
      ++d.cache_hits;
    } else {
      if (d.cache_misses == 0) MT_RETURN_IF_ERROR(TimeCopies(layer, true));
      MT_RETURN_IF_ERROR(CopyExpert(layer, ids[i], slot));
      ++d.cache_misses;
    }
    staged[ids[i]] = SlotPointers(slot);
  }
  d.fetched_experts = d.cache_misses;
  d.bytes_h2d = d.fetched_experts * static_cast<int64_t>(CopiedBytes(layer));
  if (d.cache_misses > 0) MT_RETURN_IF_ERROR(TimeCopies(layer, false, d.cache_misses));
  if (n_staged_ > 0) MT_RETURN_IF_ERROR(ExpandStaged(layer));
  MT_RETURN_IF_ERROR(PublishTable(layer, device_table, compute));
  if (stats_ != nullptr) stats_->Add(d);
  return OkStatus();
}

Status ExpertOffload::ReserveHostRows(int64_t layer, int64_t n_tokens, cudaStream_t compute) {
  const auto n = static_cast<size_t>(n_tokens * dims_.d_model);
  if (x_host_.size() >= n) return OkStatus();
  const std::string what = "layer " + std::to_string(layer) + "'s hidden states";
  MT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute), "the GPU before " + what);
  ++buffer_generation_;
  MT_RETURN_IF_ERROR(x_host_.Reserve(n, what));
  MT_RETURN_IF_ERROR(out_host_.Reserve(n, what));
  if (split_) {
    MT_ASSIGN_OR_RETURN(partial_dev_,
                        cuda::DeviceBuffer<float>::Create(n, "the CPU experts' output on the GPU"));
  }
  return OkStatus();
}

Status ExpertOffload::FetchSplit(int64_t layer, const cuda::DeviceRouting& r, const float* x,
                                 cuda::ExpertPointers* device_table, cudaStream_t compute) {
  const int64_t E = dims_.n_experts;
  MT_RETURN_IF_ERROR(ReserveHostRows(layer, r.n_tokens, compute));
  MT_RETURN_IF_ERROR(ReadRouting(layer, r, x, /*whole=*/true, compute));
  const int32_t n_active = routing_host_.data()[0];
  const int32_t* ids = routing_host_.data() + 1;
  const int32_t* begin = ids + E;
  const int32_t* token_of = begin + E + 1;
  const float* weight_of = weights_host_.data();
  // What the CPU executor will index by: whole, in range (the GPU grouped it; a fault there
  // must be an error, not a wild read).
  bool consistent = begin[0] == 0 && begin[n_active] == r.n_assignments();
  for (int32_t a = 0; consistent && a < n_active; ++a) consistent = begin[a] <= begin[a + 1];
  for (int64_t j = 0; consistent && j < r.n_assignments(); ++j)
    consistent = token_of[j] >= 0 && token_of[j] < r.n_tokens;
  if (!consistent)
    return Status::Error("layer " + std::to_string(layer) + ": the GPU's routing is inconsistent");

  // Hits stay on the GPU; of the misses, the split's share is fetched, the rest left to the CPU.
  gpu_ids_.clear();
  misses_.clear();
  for (int32_t a = 0; a < n_active; ++a) {
    if (slots_->SlotOf(layer, ids[a]) >= 0)
      gpu_ids_.push_back(ids[a]);
    else
      misses_.push_back(MissCandidate{ids[a], begin[a + 1] - begin[a]});
  }
  const auto n_misses = static_cast<int64_t>(misses_.size());
  const int64_t n_hits = static_cast<int64_t>(gpu_ids_.size());
  ChooseFetched(misses_, split_model_->FetchCount(n_misses), fetched_);
  gpu_ids_.insert(gpu_ids_.end(), fetched_.begin(), fetched_.end());
  std::sort(gpu_ids_.begin(), gpu_ids_.end());
  if (!slots_->Place(layer, gpu_ids_, placed_))
    return Status::Error("layer " + std::to_string(layer) +
                         "'s experts: more active experts than cache slots");

  cuda::ExpertPointers* staged = table_host_.data() + layer * E;
  const auto n_fetched = static_cast<int64_t>(fetched_.size());
  if (n_fetched > 0) MT_RETURN_IF_ERROR(TimeCopies(layer, true));
  for (size_t i = 0; i < gpu_ids_.size(); ++i) {
    uint8_t* slot = cache_.data() + static_cast<uint64_t>(placed_[i].slot) * slot_stride_;
    if (!placed_[i].hit) MT_RETURN_IF_ERROR(CopyExpert(layer, gpu_ids_[i], slot));
    staged[gpu_ids_[i]] = SlotPointers(slot);
  }
  if (n_fetched > 0) MT_RETURN_IF_ERROR(TimeCopies(layer, false, n_fetched));
  if (n_staged_ > 0) MT_RETURN_IF_ERROR(ExpandStaged(layer));

  // The CPU's experts: their assignments over every token of the step, ascending ids as routed.
  cpu_routing_.n_tokens = r.n_tokens;
  cpu_routing_.experts.clear();
  cpu_routing_.begin.assign(1, 0);
  cpu_routing_.token_of.clear();
  cpu_routing_.weight_of.clear();
  for (int32_t a = 0; a < n_active; ++a) {
    if (std::binary_search(gpu_ids_.begin(), gpu_ids_.end(), ids[a])) continue;
    cpu_routing_.experts.push_back(ids[a]);
    cpu_routing_.token_of.insert(cpu_routing_.token_of.end(), token_of + begin[a],
                                 token_of + begin[a + 1]);
    cpu_routing_.weight_of.insert(cpu_routing_.weight_of.end(), weight_of + begin[a],
                                  weight_of + begin[a + 1]);
    cpu_routing_.begin.push_back(static_cast<int32_t>(cpu_routing_.token_of.size()));
    staged[ids[a]] = SlotPointers(zero_slot_.data());
  }
  MT_RETURN_IF_ERROR(PublishTable(layer, device_table, compute));

  const auto n_cpu = static_cast<int64_t>(cpu_routing_.experts.size());
  step_cpu_experts_[static_cast<size_t>(layer)] = n_cpu;
  LayerExpertStats d;
  d.layer = layer;
  d.cache_hits = n_hits;
  d.cache_misses = n_misses;
  d.fetched_experts = n_fetched;
  d.cpu_experts = n_cpu;
  d.bytes_h2d = n_fetched * static_cast<int64_t>(CopiedBytes(layer));
  d.split_calls = 1;
  d.q_star_sum = split_model_->q_star();
  if (stats_ != nullptr) stats_->Add(d);
  return OkStatus();
}

Status ExpertOffload::FinishStep() {
  MT_RETURN_IF_ERROR(SettleCpuShare());
  for (int64_t layer : timed_layers_) {
    const auto l = static_cast<size_t>(layer);
    float ms = 0.0f;
    MT_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, copy_start_[l], copy_end_[l]),
                            "reading the expert copies' time");
    LayerExpertStats d;
    d.layer = layer;
    d.h2d_ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    if (stats_ != nullptr) stats_->Add(d);
    if (split_model_ != nullptr)
      split_model_->ObserveCopies(timed_experts_[l], static_cast<double>(d.h2d_ns));
    if (times_ != nullptr) (*times_)[Phase::kCopies] += static_cast<double>(ms) * 1e-3;
  }
  timed_layers_.clear();
  return OkStatus();
}

void ExpertOffload::SetExpertStats(ExpertStats* stats) {
  stats_ = stats;
  if (cpu_ != nullptr) cpu_->SetExpertStats(stats);
}

int64_t ExpertOffload::TakeActiveExperts() {
  return cpu_ != nullptr ? cpu_->TakeActiveExperts() : 0;
}

}  // namespace moetier
