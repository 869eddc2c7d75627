// The offload backend's experts (--moe-backend offload): what the CUDA backend does for MoE
// layers whose experts are not in VRAM.
//
// - kGpuCache layers (banks pinned, i.e. registered with CUDA): one VRAM expert cache of slots
//   shared by all of them (ExpertSlots: the expert used next the latest out). Per step and
//   layer, once the GPU router has chosen, the active expert ids come to the host; hits keep
//   their slots, misses are copied from the bank's pinned pages by the copy engine on its own
//   stream (one contiguous range per expert), the layer's pointer table follows, and the
//   compute stream waits for those copies only. A bank held as BF16C (PlanInputs::pack_pinned)
//   is copied packed into a staging buffer and expanded to bf16 into the slot on a third stream
//   (kernels/cuda/bf16c_expand.h): fewer bytes over PCIe, the same bf16 in the slot.
// - Prefill streaming: in a step of at least stream_min_tokens() tokens (most of every layer's
//   experts are active), each kGpuCache layer's whole bank is copied into one of two VRAM
//   buffers instead, the next cached layer's into the other while this one computes, and the
//   cache is left as it was. No routing comes to the host, and copies overlap compute.
// - Hybrid (ComputeOptions::split_misses), in decode-sized steps: the misses are split
//   (experts/miss_split.h) — a share fetched as above, the rest computed by the CPU executor in
//   place (from the layer's CPU copy where it has one: ExpertSource::CpuExpert), from the
//   layer's input and routing read back with the active ids. The GPU computes
//   the hits and fetched experts (the CPU's point at a zeroed slot, so their outputs are zero)
//   while the CPU computes its share; their partial sums meet in the routed sum. The host thread
//   computes the share before queuing the rest of the step; with MOETIER_CPU_SHARE_ASYNC=1 (and
//   a GPU that maps host memory) a worker thread does, the stream waiting for it on a HostFlag
//   (kernels/cuda/host_flag.h) while the host goes on queuing (measured slower: the .cpp says
//   why).
// - kCpuExecutor layers (banks locked or pageable): the layer's input goes to the host, the CPU
//   backend's MoE (router, experts, routed sum) runs on it, the result comes back; the GPU waits
//   for that layer only. In a long prefill step, those whose banks the GPU can read may instead
//   be staged: CPU threads copy the bank through the pinned StagingRing into a prefill buffer
//   (a BF16C bank into the staging buffer, expanded from there), as pinned banks are streamed,
//   and the GPU computes them (LockedPrefill picks the cheaper way by measured cost).
//
// Slot reuse is safe because Fetch reads the routing after a stream synchronization: every
// kernel of earlier layers, the only readers of an evicted slot, has finished.
//
// Each such synchronization ends a segment of the compute stream's work (ComputeSegments: the
// CUDA backend records a decode step's segments as CUDA graphs and replays them): what this
// class queues on the compute stream inside a segment (the routing and hidden states to the
// host, the CPU's output back) is part of the recording and is not queued again while it
// replays; the copy stream's work, the table and the waits for it are queued each step.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/pinned_buffer.h"
#include "backend/cuda/staging_ring.h"
#include "core/phase_times.h"
#include "core/status.h"
#include "experts/expert_slots.h"
#include "experts/locked_prefill.h"
#include "experts/miss_split.h"
#include "experts/routing.h"
#include "kernels/cuda/bf16c_expand.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/expert_ffn.h"
#include "kernels/cuda/host_flag.h"
#include "kernels/cuda/routing.h"
#include "ops/expert_source.h"

namespace moetier {

class CpuBackend;

// The compute stream's work between the host's synchronizations with it, as the CUDA backend
// runs it: launched call by call, recorded, or replayed from a recording (step_graphs.h).
class ComputeSegments {
 public:
  virtual ~ComputeSegments() = default;
  // Ends the segment: what was queued on the compute stream since the last Resume is launched
  // (a recording ends and runs); the host may then wait for the stream.
  virtual void Pause() = 0;
  // Starts the next segment; `variant` is what decides its launches besides the step's shape
  // (whether it copies a CPU share in).
  virtual void Resume(int variant) = 0;
  // The segment's recording was launched: queue nothing on the compute stream until Pause.
  virtual bool replaying() const = 0;
};

class ExpertOffload {
 public:
  // Checks the cached layers' banks (dtype the GPU reads, each expert one contiguous range);
  // creates the copy stream and, when some layer is kCpuExecutor, the CPU backend.
  static Expected<std::unique_ptr<ExpertOffload>> Create(const ComputeOptions& options,
                                                         const ExpertSource& experts,
                                                         const ModelDims& dims);
  ~ExpertOffload();

  ExpertHome home(int64_t layer) const { return homes_[static_cast<size_t>(layer)]; }
  bool has_cached_layers() const { return cached_bytes_ > 0; }
  // A kCpuExecutor layer whose bank the GPU can read (a GPU dtype or BF16C, one range per
  // expert, the size of the other GPU-run layers' experts): its long prefill steps may be staged.
  bool stageable(int64_t layer) const { return stageable_[static_cast<size_t>(layer)]; }
  // In this step: whether the GPU computes `layer`'s experts (VRAM, cached, or staged), and
  // whether they come through Fetch (cached or staged).
  bool GpuComputes(int64_t layer) const {
    return home(layer) != ExpertHome::kCpuExecutor || Staged(layer);
  }
  bool Fetches(int64_t layer) const {
    return home(layer) == ExpertHome::kGpuCache || Staged(layer);
  }

  // Sizes and allocates the cache, once (the CUDA backend calls it once the KV pool is in VRAM;
  // Fetch, if that never happened): --moe-cache-gb, else the free VRAM less a workspace reserve
  // (capped at what the cached layers hold). At least one layer's experts, since a step may
  // activate all of them. Also the prefill buffers and, with stageable layers, the staging ring.
  Status AllocateCache();
  bool cache_allocated() const { return allocated_; }

  // Starts a step of n_tokens tokens (compute: the CUDA backend's stream): decides whether it
  // streams whole banks and, if so, queues the first cached layer's.
  Status BeginStep(int64_t n_tokens, cudaStream_t compute);
  // Whether this step streams whole banks.
  bool streaming() const { return streaming_; }
  // The segments of the compute stream's work (null: launched call by call); must outlive this.
  void SetSegments(ComputeSegments* segments) { segments_ = segments; }
  // Changes whenever a buffer that the compute stream's segments name is reallocated.
  int64_t buffer_generation() const { return buffer_generation_; }
  // Whether the CPU's share of a hybrid step runs on a worker that the stream waits for.
  bool cpu_share_on_worker() const { return cpu_done_ != nullptr; }
  // The crossover: steps of at least this many tokens stream (the header says how).
  int64_t stream_min_tokens() const { return stream_min_tokens_; }

  // For a kGpuCache layer after the GPU routed (r on `compute`): places the active experts,
  // queues the misses' copies and the pointer table into `device_table` ([n_experts] of this
  // layer) on the copy stream, and makes `compute` wait for them. Adds the layer's hits, misses
  // and bytes copied to the stats. In a streaming step: points the table at the layer's bank in
  // its stream buffer and queues the next cached layer's bank into the other.
  // x: the layer's input [r.n_tokens, d_model] on the device (read back by hybrid steps).
  Status Fetch(int64_t layer, const cuda::DeviceRouting& r, const float* x,
               cuda::ExpertPointers* device_table, cudaStream_t compute);
  // After Fetch and the GPU's expert launches for the same layer: in a hybrid step with misses
  // left to the CPU, has them computed (the GPU works meanwhile), resumes the compute segments
  // and queues their weighted sum [n_tokens, d_model] to the device on `compute` (after a wait
  // for the worker, or computed here first); returns it, or null when the CPU had none.
  Expected<const float*> ComputeCpuShare(int64_t layer, cudaStream_t compute);
  // Experts of `layer` the CPU computed in this step's hybrid split (0 otherwise).
  int64_t StepCpuExperts(int64_t layer) const {
    return step_cpu_experts_.empty() ? 0 : step_cpu_experts_[static_cast<size_t>(layer)];
  }
  // Whether this step splits misses (hybrid, a decode-sized step).
  bool splitting() const { return split_step_; }

  // For a kCpuExecutor layer: x [n_tokens, d_model] (device) to the host, the CPU backend's
  // Moe, out (device) from the host, ordered on `compute` (a segment ends before the host waits
  // for x and the next begins before out). router_logits: as ComputeBackend::Moe.
  Status RunOnCpu(const TensorView& router, const RouterOptions& opts, int64_t layer,
                  const float* x, int64_t n_tokens, float* out, float* router_logits,
                  cudaStream_t compute);

  void SetExpertStats(ExpertStats* stats);
  void SetPhaseTimes(PhaseTimes* times) { times_ = times; }
  // After the step's synchronization: adds each layer's copy-engine time of this step's copies
  // (events recorded by Fetch when stats, the split or phase times need them) to the stats, the
  // split's rates and the phase times, and the CPU share's times; fails if the CPU share's
  // watchdog fired.
  Status FinishStep();
  // The CPU layers' active experts since the last call.
  int64_t TakeActiveExperts();

 private:
  ExpertOffload(const ExpertSource& experts, const ModelDims& dims);
  // A CUDA call's result for layer `layer` ("copying layer 3's experts to the GPU"); the
  // message is built only on failure, as these calls run for every offloaded layer of every step.
  static Status LayerStatus(cudaError_t err, const char* action, int64_t layer, const char* object);

  // The hybrid split, starting from the rates an earlier run on this GPU measured for experts
  // of this format and size, read by the CPU in cpu_dtype (a CPU copy's, else the same), with
  // this many threads (split_profile.h), when q* is not forced.
  void MakeSplitModel(const ComputeOptions& options, DType dtype, DType cpu_dtype);
  // Keeps the split's measured rates for the next run (at destruction).
  void SaveSplitRates() const;

  Status FetchStreamed(int64_t layer, cuda::ExpertPointers* device_table, cudaStream_t compute);
  Status FetchSplit(int64_t layer, const cuda::DeviceRouting& r, const float* x,
                    cuda::ExpertPointers* device_table, cudaStream_t compute);
  // Reads the routing's n_active and active ids (and, to split, the whole routing and x) into
  // the pinned buffers; waits for them.
  // Ends the compute segment first.
  Status ReadRouting(int64_t layer, const cuda::DeviceRouting& r, const float* x, bool whole,
                     cudaStream_t compute);
  // The routing (with `whole`: and its weights and x) to the pinned host buffers, on compute.
  Status QueueRoutingRead(int64_t layer, const cuda::DeviceRouting& r, const float* x, bool whole,
                          int64_t n_ints, cudaStream_t compute);
  bool replaying() const { return segments_ != nullptr && segments_->replaying(); }
  void PauseSegment() {
    if (segments_ != nullptr) segments_->Pause();
  }
  void ResumeSegment(int variant) {
    if (segments_ != nullptr) segments_->Resume(variant);
  }
  // Queues the copy of (layer, expert) into slot `slot` on the copy stream (a packed expert's
  // into the staging buffer, its expansion into the slot queued with its group's).
  Status CopyExpert(int64_t layer, int32_t expert, uint8_t* slot);
  // A bank's experts as the GPU takes them: the dtype it computes, their bytes in a slot (and
  // gate's, up's), their bytes in the bank, and whether they are packed (BF16C).
  struct BankShape {
    DType computed = DType::kF32;
    uint64_t slot_bytes = 0, gate_up_bytes = 0, bytes = 0;
    bool packed = false;
  };
  // Why the GPU cannot fetch `layer`'s bank, after "the experts of layer N" (empty: it can);
  // fills `shape`.
  std::string FetchableBank(int64_t layer, BankShape& shape) const;
  // Why a fetchable bank cannot share the slots (and staging buffer) of those noted before.
  std::string FitsOtherBanks(const BankShape& shape) const;
  // Takes a fetched layer's sizes (and packing) as the slots' and the staging buffer's.
  void NoteBank(int64_t layer, const BankShape& shape);
  // Checks a kGpuCache layer's bank (what Create says) and notes it.
  Status CheckCachedLayer(int64_t layer);
  Status CreateExpandStream();
  // One expert's bytes as `layer`'s copies move them (packed, or as the slots hold them).
  uint64_t CopiedBytes(int64_t layer) const {
    return packed_[static_cast<size_t>(layer)] ? packed_bytes_ : expert_bytes_;
  }
  // staging_ for n_experts packed experts.
  Status AllocateStaging(int64_t n_experts);
  // Makes the copy stream wait until the staging buffer's last expansion has read it.
  Status WaitForStaging();
  // Queues the expansion of the experts staged since the last call (after their copies).
  Status QueueExpansions(int64_t layer);
  // Queues what is left of a layer's expansions; `expanded_` then marks their end, which
  // PublishTable has the compute stream wait for and the next staging copies too.
  Status ExpandStaged(int64_t layer);
  // Queues the expansion of a whole bank, staged, into dst (slot_stride_ apart).
  Status ExpandInto(int64_t layer, uint8_t* dst);
  // Host buffers for a layer's input and output of n_tokens tokens, and with the split the
  // device buffer for the CPU's output (synchronizes to regrow).
  Status ReserveHostRows(int64_t layer, int64_t n_tokens, cudaStream_t compute);
  cuda::ExpertPointers SlotPointers(uint8_t* slot) const {
    return cuda::ExpertPointers{slot, slot + gate_bytes_, slot + gate_bytes_ + up_bytes_};
  }
  // Queues layer's whole bank into stream buffer b on the copy stream, once `compute` has run
  // everything queued on it so far (the buffer's last reader among it).
  Status StreamBank(int64_t layer, int b, cudaStream_t compute);
  // Where a whole bank's copy for `dst` goes: dst itself, or for a packed bank the staging
  // buffer (the copy stream then waits for its last reader; ExpandInto takes it on to dst),
  // with an expert's bytes there and their stride.
  struct BankTarget {
    uint8_t* to;
    uint64_t bytes, stride;
  };
  Expected<BankTarget> TargetOf(int64_t layer, uint8_t* dst);
  // A staged layer's bank into `dst` through the ring (returns once it is staged); its time.
  Status StageBank(int64_t layer, uint8_t* dst);
  bool Staged(int64_t layer) const { return stage_step_ && stageable(layer); }
  // The next layer after `layer` whose bank this streaming step copies (-1: none).
  int64_t NextStreamedLayer(int64_t layer) const;
  // Marks the kCpuExecutor layers the GPU can compute (stageable_; packed ones are expanded
  // after the ring's copy), from the cached layers' expert size, or sets that size from the
  // first of them when no layer is cached.
  void FindStageableLayers();
  // Records the start (before the first copy) or the end of a layer's copies for the stats.
  // (n_experts: how many the layer's timed copies hold, given at the end.)
  Status TimeCopies(int64_t layer, bool start, int64_t n_experts = 0);
  // Queues the staged pointer table of `layer` and makes `compute` wait for the copy stream.
  Status PublishTable(int64_t layer, cuda::ExpertPointers* device_table, cudaStream_t compute);

  const ExpertSource& experts_;
  ModelDims dims_;
  std::vector<ExpertHome> homes_;  // per layer id
  uint64_t requested_cache_bytes_ = 0;
  uint64_t expert_bytes_ = 0;  // gate + up + down of one expert, as a slot holds it
  uint64_t slot_stride_ = 0;   // expert_bytes_ rounded up for aligned slots
  uint64_t cached_bytes_ = 0;  // every kGpuCache layer's experts
  int64_t n_cached_layers_ = 0;
  uint64_t gate_bytes_ = 0, up_bytes_ = 0;
  // Packed (BF16C) cached layers: which, one expert's packed bytes, and the staging buffer that
  // holds one layer's (experts staging_stride_ apart, as in a bank) between copy and expansion,
  // or where VRAM is short a wave of staging_experts_ misses at a time.
  std::vector<bool> packed_;  // per layer id
  uint64_t packed_bytes_ = 0;
  uint64_t staging_stride_ = 0;
  cuda::DeviceBuffer<uint8_t> staging_;
  cudaStream_t expand_stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;    // on the copy stream: a group's copies are done
  cudaEvent_t expanded_ = nullptr;  // on the expansion stream: the last layer's expansions
  std::vector<cuda::Bf16cExpansion> expansions_;  // staged, not queued yet
  int64_t n_staged_ = 0;                          // this wave's experts in the staging buffer
  int64_t staging_experts_ = 0;                   // how many staging_ holds
  int64_t requested_staging_experts_ = 0;         // ComputeOptions::staging_experts

  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  // Per layer id, timing events around the step's miss copies (with stats), and the layers
  // timed this step.
  std::vector<cudaEvent_t> copy_start_, copy_end_;
  std::vector<int64_t> timed_layers_;

  // Prefill streaming: two buffers of one layer's experts (slot_stride_ apart), the layer each
  // holds or receives this step (-1: none), and whether this step streams.
  int64_t stream_min_tokens_ = 0;
  cuda::DeviceBuffer<uint8_t> stream_buf_;  // [2][n_experts] slots
  int64_t stream_layer_[2] = {-1, -1};
  bool streaming_ = false;
  cudaEvent_t stream_ready_ = nullptr;  // on compute: the buffer's earlier readers are done
  cuda::DeviceBuffer<uint8_t> cache_;
  std::unique_ptr<ExpertSlots> slots_;
  bool allocated_ = false;  // AllocateCache ran

  // Locked layers' long prefill steps staged to the GPU.
  std::vector<bool> stageable_;  // per layer id
  bool has_stageable_ = false;
  std::unique_ptr<LockedPrefill> locked_prefill_;
  std::unique_ptr<cuda::StagingRing> ring_;
  std::vector<cuda::StagingRing::Range> stage_ranges_;
  bool stage_step_ = false;  // this step stages them
  std::vector<ExpertSlots::Placement> placed_;
  cuda::PinnedBuffer<cuda::ExpertPointers> table_host_;  // [n_layers * n_experts] staged

  std::unique_ptr<CpuBackend> cpu_;
  cuda::PinnedBuffer<float> x_host_, out_host_;  // a layer's input and its CPU experts' output
  ExpertStats* stats_ = nullptr;
  PhaseTimes* times_ = nullptr;
  ComputeSegments* segments_ = nullptr;
  int64_t buffer_generation_ = 0;

  // Hybrid: the split's model, whether this step splits, and the current layer's split.
  bool split_ = false;
  std::unique_ptr<MissSplit> split_model_;
  // Where the split's measured rates are kept between runs (split_profile.h), and their key.
  std::filesystem::path split_profile_;
  std::string split_key_;
  bool split_step_ = false;
  cuda::PinnedBuffer<int32_t> routing_host_;  // n_active, experts, begin, token_of
  cuda::PinnedBuffer<float> weights_host_;    // weight_of
  std::vector<MissCandidate> misses_;
  std::vector<int32_t> gpu_ids_, fetched_;
  Routing cpu_routing_;                    // the misses the CPU computes, over all tokens
  std::vector<int64_t> step_cpu_experts_;  // per layer id, this step
  std::vector<int64_t> timed_experts_;     // per layer id: experts in its timed copies
  cuda::DeviceBuffer<uint8_t> zero_slot_;  // one expert of zeros: the CPU's experts' table
  cuda::DeviceBuffer<float> partial_dev_;  // the CPU's weighted sum on the device

  // The CPU executor (expert_offload_cpu.cpp), for kCpuExecutor layers and hybrid's share: with
  // a split, its threads spin between jobs and, with MOETIER_CPU_SHARE_ASYNC=1, the worker.
  void StartCpuSide(int n_threads);
  // The CPU share's worker (hybrid, where the GPU maps host memory): one job at a time, the
  // layer whose cpu_routing_ it computes into out_host_, then it publishes the job's value.
  void CpuWorkerLoop();
  // Runs the CPU executor on layer's cpu_routing_ (x_host_ -> out_host_); records its time.
  void RunCpuShare(int64_t layer);
  // Whether a job started `now` counts in the split's CPU rate: when the executor's threads are
  // still spinning from the last job (it ended within their spin wait, kCpuShareSpinMicros), so
  // that it costs what it would in use; the first job of a decode, after idle, pays for waking
  // them. Under a shorter spin set by MOETIER_SPIN_US waking is part of every job, and every job
  // counts. The last job's end is noted by NoteCpuJobEnd. Called from the one thread running the
  // executor at the time.
  bool CpuJobCounts(std::chrono::steady_clock::time_point now) const;
  void NoteCpuJobEnd(std::chrono::steady_clock::time_point end);
  // Folds the CPU times the worker recorded into the split's rates (the jobs that count) and the
  // phase times (every job).
  void TakeCpuTimes();
  // After a synchronization of the compute stream: fails if the CPU share's watchdog fired (its
  // worker has not finished); else takes its times.
  Status SettleCpuShare();
  std::unique_ptr<cuda::HostFlag> cpu_done_;
  std::thread cpu_worker_;
  std::mutex cpu_mu_;
  std::condition_variable cpu_cv_;
  int64_t cpu_job_layer_ = -1;  // guarded by cpu_mu_
  uint32_t cpu_job_value_ = 0;
  bool cpu_stop_ = false;
  std::atomic<bool> cpu_busy_{false};  // from the job's hand-off to its publication
  // Recorded by RunCpuShare, taken by the host: the jobs that count (CpuJobCounts), and the
  // time of those that had to wake them.
  std::atomic<int64_t> cpu_ns_{0}, cpu_experts_{0}, cpu_waking_ns_{0};
  std::atomic<int64_t> cpu_job_end_ns_{-1};  // the last job's end (steady clock), -1: none yet
};

}  // namespace moetier
