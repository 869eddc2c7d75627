#include "backend/cuda/expert_offload.h"

#include <algorithm>
#include <cstdio>
#include <span>

#include "backend/cpu/cpu_backend.h"
#include "core/log.h"
#include "kernels/cuda/cuda_check.h"

namespace moetier {

namespace {

// VRAM the default cache leaves free: buffers regrown for a longer step than any before,
// cuBLAS's workspace, the CUDA context's own allocations.
constexpr uint64_t kWorkspaceReserveBytes = uint64_t{1} << 30;
// Slots start on this boundary: the expert kernels' 16-byte loads and whole cache lines.
constexpr uint64_t kSlotAlignment = 256;

bool GpuReadsExperts(DType t) {
  return t == DType::kBF16 || t == DType::kQ8_0 || t == DType::kQ4_0;
}

std::string Gb(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return s;
}

// A CUDA call's result for layer `layer` ("copying layer 3's experts to the GPU"); the message
// is built only on failure, as these calls run for every offloaded layer of every step.
Status LayerStatus(cudaError_t err, const char* action, int64_t layer, const char* object) {
  if (err == cudaSuccess) return OkStatus();
  return cuda::CudaStatus(err, std::string(action) + " layer " + std::to_string(layer) + object);
}

}  // namespace

ExpertOffload::ExpertOffload(const ExpertSource& experts, const ModelDims& dims)
    : experts_(experts), dims_(dims) {}

ExpertOffload::~ExpertOffload() {
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (copied_ != nullptr) cudaEventDestroy(copied_);
}

Expected<std::unique_ptr<ExpertOffload>> ExpertOffload::Create(const ComputeOptions& options,
                                                               const ExpertSource& experts,
                                                               const ModelDims& dims) {
  std::unique_ptr<ExpertOffload> o(new ExpertOffload(experts, dims));
  o->homes_ = options.expert_homes;
  o->homes_.resize(static_cast<size_t>(dims.n_layers), ExpertHome::kVram);
  o->requested_cache_bytes_ = options.expert_cache_bytes;
  const int64_t E = dims.n_experts;
  bool cpu_layers = false;
  for (int64_t layer : dims.moe_layers) {
    if (o->home(layer) == ExpertHome::kCpuExecutor) cpu_layers = true;
    if (o->home(layer) != ExpertHome::kGpuCache) continue;
    const std::string where = "the experts of layer " + std::to_string(layer);
    for (int64_t e = 0; e < E; ++e) {
      const ExpertWeights& w = experts.Expert(layer, e);
      if (!GpuReadsExperts(w.gate.dtype))
        return Status::Error(where + " are " + std::string(DTypeName(w.gate.dtype)) +
                             ": the GPU reads bf16, q8_0 or q4_0 experts");
      // One copy per expert: gate, up and down back to back, as banks lay them out.
      const auto* gate = static_cast<const uint8_t*>(w.gate.data);
      if (w.up.data != gate + w.gate.n_bytes || w.down.data != gate + w.gate.n_bytes + w.up.n_bytes)
        return Status::Error(where + " are not stored as one range per expert (a bank)");
      const uint64_t bytes = w.gate.n_bytes + w.up.n_bytes + w.down.n_bytes;
      if (o->expert_bytes_ != 0 && bytes != o->expert_bytes_)
        return Status::Error(where + " differ in size from the other cached layers'");
      o->expert_bytes_ = bytes;
      o->gate_bytes_ = w.gate.n_bytes;
      o->up_bytes_ = w.up.n_bytes;
    }
    o->cached_bytes_ += o->expert_bytes_ * static_cast<uint64_t>(E);
    ++o->n_cached_layers_;
  }
  o->slot_stride_ = (o->expert_bytes_ + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  if (o->has_cached_layers()) {
    MT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&o->copy_stream_, cudaStreamNonBlocking),
                            "creating the expert copy stream");
    MT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&o->copied_, cudaEventDisableTiming),
                            "creating the expert copy event");
    MT_RETURN_IF_ERROR(o->active_host_.Reserve(static_cast<size_t>(1 + E), "the routing"));
    MT_RETURN_IF_ERROR(o->table_host_.Reserve(static_cast<size_t>(dims.n_layers * E),
                                              "the expert cache's tables"));
  }
  if (cpu_layers) o->cpu_ = std::make_unique<CpuBackend>(options.n_threads, experts, dims.d_model);
  return o;
}

Status ExpertOffload::AllocateCache() {
  if (!has_cached_layers() || cache_allocated()) return OkStatus();
  const int64_t E = dims_.n_experts;
  const uint64_t min_bytes = slot_stride_ * static_cast<uint64_t>(E);  // a step may use them all
  const uint64_t all_bytes = min_bytes * static_cast<uint64_t>(n_cached_layers_);
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
  slots_ = std::make_unique<ExpertSlots>(n_slots, dims_.n_layers, E);
  LogInfo("gpu: expert cache of " + std::to_string(n_slots) + " experts (" + Gb(cache_.bytes()) +
          ", " +
          (requested_cache_bytes_ != 0 ? std::string("--moe-cache-gb") : "auto: the free VRAM") +
          ") for " + std::to_string(n_cached_layers_) + " layer(s) of pinned experts (" +
          Gb(cached_bytes_) + ")");
  return OkStatus();
}

Status ExpertOffload::Fetch(int64_t layer, const cuda::DeviceRouting& r,
                            cuda::ExpertPointers* device_table, cudaStream_t compute) {
  if (!cache_allocated()) MT_RETURN_IF_ERROR(AllocateCache());
  const int64_t E = dims_.n_experts;
  // n_active and the active ids sit together at the start of the routing's integers.
  MT_RETURN_IF_ERROR(LayerStatus(
      cudaMemcpyAsync(active_host_.data(), r.n_active, static_cast<size_t>(1 + E) * sizeof(int32_t),
                      cudaMemcpyDeviceToHost, compute),
      "reading the routing of", layer, "'s experts"));
  MT_RETURN_IF_ERROR(
      LayerStatus(cudaStreamSynchronize(compute), "the GPU before", layer, "'s experts"));
  const int32_t n_active = std::clamp<int32_t>(active_host_.data()[0], 0, static_cast<int32_t>(E));
  const std::span<const int32_t> ids(active_host_.data() + 1, static_cast<size_t>(n_active));
  for (int32_t id : ids)
    if (id < 0 || id >= E)
      return Status::Error("the GPU router chose no expert " + std::to_string(id));
  if (!slots_->Place(layer, ids, placed_))
    return Status::Error("layer " + std::to_string(layer) +
                         "'s experts: more active experts than cache slots");
  cuda::ExpertPointers* staged = table_host_.data() + layer * E;
  LayerExpertStats d;
  d.layer = layer;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint8_t* slot = cache_.data() + static_cast<uint64_t>(placed_[i].slot) * slot_stride_;
    if (placed_[i].hit) {
      ++d.cache_hits;
    } else {
      const ExpertWeights& w = experts_.Expert(layer, ids[i]);
      MT_RETURN_IF_ERROR(LayerStatus(
          cudaMemcpyAsync(slot, w.gate.data, expert_bytes_, cudaMemcpyHostToDevice, copy_stream_),
          "copying", layer, "'s experts to the GPU"));
      ++d.cache_misses;
      d.bytes_h2d += static_cast<int64_t>(expert_bytes_);
    }
    staged[ids[i]] = cuda::ExpertPointers{slot, slot + gate_bytes_, slot + gate_bytes_ + up_bytes_};
  }
  MT_RETURN_IF_ERROR(LayerStatus(
      cudaMemcpyAsync(device_table, staged, static_cast<size_t>(E) * sizeof(cuda::ExpertPointers),
                      cudaMemcpyHostToDevice, copy_stream_),
      "copying", layer, "'s expert table"));
  MT_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_, copy_stream_), "recording the copies");
  MT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute, copied_, 0), "waiting for the copies");
  if (stats_ != nullptr) stats_->Add(d);
  return OkStatus();
}

Status ExpertOffload::RunOnCpu(const TensorView& router, const RouterOptions& opts, int64_t layer,
                               const float* x, int64_t n_tokens, float* out, float* router_logits,
                               cudaStream_t compute) {
  const auto n = static_cast<size_t>(n_tokens * dims_.d_model);
  if (x_host_.size() < n) {
    const std::string what = "layer " + std::to_string(layer) + "'s hidden states";
    MT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute), "the GPU before " + what);
    MT_RETURN_IF_ERROR(x_host_.Reserve(n, what));
    MT_RETURN_IF_ERROR(out_host_.Reserve(n, what));
  }
  MT_RETURN_IF_ERROR(LayerStatus(
      cudaMemcpyAsync(x_host_.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost, compute),
      "copying", layer, "'s hidden states to the host"));
  MT_RETURN_IF_ERROR(
      LayerStatus(cudaStreamSynchronize(compute), "the GPU before", layer, "'s CPU experts"));
  cpu_->Moe(router, opts, layer, x_host_.data(), n_tokens, out_host_.data(), router_logits);
  MT_RETURN_IF_ERROR(LayerStatus(
      cudaMemcpyAsync(out, out_host_.data(), n * sizeof(float), cudaMemcpyHostToDevice, compute),
      "copying", layer, "'s expert output to the GPU"));
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
