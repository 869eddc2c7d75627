// The CUDA backend (--moe-backend gpu and offload): every operation of the forward pass on one
// GPU stream, the dense weights and the KV pool in VRAM (DeviceWeights). Each MoE layer's experts
// are where ComputeOptions::expert_homes says: in VRAM (gpu), or, with offload, copied into the
// VRAM expert cache or computed by the CPU executor (ExpertOffload). The kernels are
// kernels/cuda's; this file only sizes buffers, maps the decoder's host views to device copies
// and moves what must cross PCIe each step: the batch's indices in (one copy), the logits out.
//
// With every expert in VRAM nothing reaches the host inside a step but the router logits when a
// test asks for them: the routing stays on the device (router.h), the non-finite scans and the
// active-expert counts are read after the logits, so a step is a fixed sequence of launches on
// one stream, and decode steps are recorded once per shape as CUDA graphs and replayed
// (step_graphs.h). Offloaded layers add one synchronization each (expert_offload.h): a decode
// step's launches between them are recorded and replayed as segments (ComputeSegments), the
// host's work for those layers runs in between.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/expert_offload.h"
#include "backend/cuda/pinned_buffer.h"
#include "backend/cuda/step_graphs.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/dense.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/expert_ffn.h"
#include "kernels/cuda/routing.h"
#include "ops/expert_source.h"

namespace moetier {

class CudaBackend final : public ComputeBackend, private ComputeSegments {
 public:
  // On device 0; fails (naming what) when no device answers. `experts` must outlive it.
  static Expected<std::unique_ptr<ComputeBackend>> Create(const ComputeOptions& options,
                                                          const ExpertSource& experts,
                                                          const ModelDims& dims);
  // Whether the kernels take a model of these dims (head_dim, experts, top-k), before any VRAM
  // is touched; the error names what does not fit.
  static Status CheckDims(const ModelDims& dims);
  ~CudaBackend() override;

  Status Hold(std::span<const TensorView* const> matrices,
              std::span<const std::vector<float>* const> vectors) override;
  uint64_t KvMemoryFree() const override;
  Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) override;
  void BeginStep(const Batch& batch, const KvPool& kv, StepOutput output) override;
  float* Activations(Act slot, int64_t n_tokens, int64_t width) override;
  void Embed(const TensorView& table, std::span<const int32_t> tokens, float* h) override;
  void RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
               const std::vector<float>& weight, float eps, int64_t d, float* y) override;
  void Add(const float* x, int64_t n, float* y) override;
  void AddRmsNorm(const float* x, int64_t n_rows, float* h, const std::vector<float>& weight,
                  float eps, int64_t d, float* y) override;
  // The scan inside the norm's launch.
  int64_t AddRmsNormScan(const float* x, int64_t n_rows, float* h, const std::vector<float>& weight,
                         float eps, int64_t d, float* y, int64_t slot) override;
  void MatMul(const float* x, int64_t n_tokens, std::span<const MatMulOut> targets) override;
  void SiluMul(float* gate, const float* up, int64_t n) override;
  void Attend(const AttentionWeights& w, const AttentionShape& shape, const Rope& rope,
              int64_t layer, const Batch& batch, KvPool& kv, float* q, float* k, float* v,
              float* out) override;
  void Moe(const TensorView& router, const RouterOptions& opts, int64_t layer, const float* x,
           int64_t n_tokens, float* out, float* router_logits) override;
  int64_t TakeActiveExperts() override;
  int64_t ScanNonFinite(const float* x, int64_t n, int64_t slot) override;
  std::span<const int64_t> NonFiniteScans() override { return scans_; }
  Status EndStep() override;
  void Logits(const float* x, int64_t n_rows, const TensorView& lm_head, float* logits) override;
  void ArgMaxLogits(const float* x, int64_t n_rows, const TensorView& lm_head, int32_t* ids,
                    int64_t scan_slot) override;
  void TopKLogits(const float* x, int64_t n_rows, const TensorView& lm_head, LogitCandidate* cands,
                  int32_t* counts, RowLogSum* sums, int64_t scan_slot) override;
  Status CopyLogitsRow(int64_t r, float* out) override;
  bool SelectsTopK() const override { return true; }
  // With times, the expert kernels and copies are timed on the GPU too (CUDA events).
  void SetPhaseTimes(PhaseTimes* times) override;
  PhaseTimes* phase_times() const override { return times_; }
  void SetExpertStats(ExpertStats* stats) override;
  std::vector<int64_t> LayersWithOwnExperts() const override { return vram_layers_; }
  void ExpectRouterLogits(bool on) override { router_logits_expected_ = on; }
  int64_t ReplayedSteps() const override { return graphs_.replayed_steps(); }

 private:
  CudaBackend(const ExpertSource& experts, const ModelDims& dims);
  // The experts of `layer` on the GPU, through the cache when they live in a pinned bank;
  // the count of active experts also lands in *active_record when that is not null.
  void RunExpertsOnGpu(int64_t layer, const float* x, float* out, int32_t* active_record);
  // With phase times: records the start or end of layer's expert kernels on the stream.
  void TimeExperts(int64_t layer, bool start);
  // Buffers for steps of up to n_tokens tokens (kept; regrown, after a sync, only for a larger
  // step than any before).
  Status Reserve(int64_t n_tokens);
  // Quantized norm output: when a held Q8_0/Q4_0 matrix multiplies rows of d_model, the norms
  // of up to DenseMatMul::kMaxDecodeTokens rows also write their output quantized, and a product
  // of those rows reads it instead of quantizing them again (one launch less a product).
  Status HoldQuantizedNorms(std::span<const TensorView* const> matrices);
  // Where a norm writing n_rows rows of d to y puts them quantized (empty: nowhere); from then
  // on QuantizedInput(y, n_rows) finds them, until the next norm, step or buffer move.
  cuda::QuantizedActs QuantizedNormOut(const float* y, int64_t n_rows, int64_t d);
  // x's quantized rows when the last norm wrote them, else null.
  const cuda::QuantizedActs* QuantizedInput(const float* x, int64_t n_rows);
  // The residual add and norm (QuantizedNormOut's output too), scanning the sums into *first
  // when first is not null.
  void LaunchAddRmsNorm(const float* x, int64_t n_rows, float* h, const std::vector<float>& weight,
                        float eps, int64_t d, float* y, unsigned long long* first);
  // A CUDA error inside a step: the backend's calls return nothing, so the first one is kept
  // and EndStep reports it as the step's failure.
  void Check(cudaError_t err, const char* what);
  // Whether the step just begun is replayed, recorded or launched call by call (after its
  // indices were queued): decode steps are recorded, unless they are timed, hand router logits
  // out or stream banks.
  void ChooseGraphMode(const Batch& batch, const KvPool& kv, StepOutput output);
  // Batch::draws to the device (before a recorded step replays); what drawing them there takes.
  cuda::DrawWork UploadDraws(const Batch& batch);
  // The segment's graph is running: the calls keep their host bookkeeping and launch nothing.
  bool Replaying() const { return graph_mode_ == cuda::StepGraphs::Mode::kReplay; }
  // Records, replays or launches the segment of segment_key_.
  void BeginSegment();
  // ComputeSegments, for the offloaded layers' synchronizations.
  void Pause() override;
  void Resume(int variant) override;
  bool replaying() const override { return Replaying(); }
  // A device buffer the recorded graphs name is about to be reallocated: they are dropped.
  void BuffersMoving();
  // Ends the recording of the step (launching its graph, unless the step failed).
  void FinishCapture();

  const ExpertSource& experts_;
  ModelDims dims_;
  cudaStream_t stream_ = nullptr;
  cuda::DeviceWeights weights_;
  std::vector<int64_t> vram_layers_;        // layers whose experts Hold copied to VRAM
  std::unique_ptr<ExpertOffload> offload_;  // where layers' experts live, when not all in VRAM
  cuda::DenseMatMul dense_;
  cuda::ExpertFfn ffn_;
  int64_t capacity_tokens_ = 0;
  bool ffn_built_ = false;  // ffn_ is sized for the experts (known after Hold)
  PhaseTimes* times_ = nullptr;
  std::vector<cudaEvent_t> expert_events_;    // [n_layers][start, end], made with phase times
  std::vector<int64_t> timed_expert_layers_;  // this step's, read at EndStep
  ExpertStats* stats_ = nullptr;
  std::vector<int64_t> moe_call_layer_;  // the layer of each Moe call this step
  int64_t step_tokens_ = 0;
  std::string error_;  // the first CUDA error of the current step

  bool graphs_wanted_ = false;   // ComputeOptions::cuda_graphs
  bool graphs_enabled_ = false;  // ... and no CPU share on a worker (known at Hold)
  bool router_logits_expected_ = false;
  cuda::StepGraphs graphs_;
  cuda::StepGraphs::Mode graph_mode_ = cuda::StepGraphs::Mode::kEager;
  bool step_recorded_ = false;         // this step runs as recorded segments
  cuda::StepGraphs::Key segment_key_;  // the current segment's
  int64_t offload_generation_ = 0;     // ExpertOffload::buffer_generation of the graphs

  std::array<cuda::DeviceBuffer<float>, static_cast<size_t>(Act::kCount)> acts_;
  cuda::DeviceBuffer<int8_t> normed_q_;  // [kMaxDecodeTokens, d_model] (HoldQuantizedNorms)
  cuda::DeviceBuffer<float> normed_d_;   // [kMaxDecodeTokens, d_model / 32]
  const float* normed_q_of_ = nullptr;   // the rows they hold, null when none
  int64_t normed_q_rows_ = 0;
  cuda::QuantizedActs normed_acts_;           // the two, once allocated
  cuda::DeviceBuffer<float> inv_freq_;        // [head_dim / 2] RoPE
  cuda::DeviceBuffer<uint8_t> attn_scratch_;  // the decode attention's split states

  // The step's indices: tokens, positions, seq_of, logit rows, block tables, staged then copied.
  cuda::PinnedBuffer<int32_t> step_host_;
  cuda::DeviceBuffer<int32_t> step_dev_;
  const int32_t* tokens_dev_ = nullptr;
  const int32_t* logit_rows_dev_ = nullptr;
  const int32_t* logit_rows_host_ = nullptr;  // the Batch's, to recognise RmsNorm's rows
  cuda::DeviceBatch batch_dev_;

  // The router's outputs and the device routing of the current MoE layer.
  cuda::DeviceBuffer<float> router_logits_;  // [tokens, n_experts]
  cuda::DeviceBuffer<int32_t> topk_ids_;     // [tokens, top_k]
  cuda::DeviceBuffer<float> topk_weights_;
  cuda::DeviceBuffer<int32_t> routing_ints_;
  cuda::DeviceBuffer<float> routing_weights_;
  cuda::DeviceRouting routing_;

  // Read back after the logits: per MoE call its active-expert count, per scan slot its first
  // non-finite index.
  cuda::DeviceBuffer<int32_t> active_dev_;  // [n_layers]
  cuda::PinnedBuffer<int32_t> active_host_;
  int64_t moe_calls_ = 0;
  int64_t active_experts_ = 0;  // summed at EndStep, taken by TakeActiveExperts
  cuda::DeviceBuffer<unsigned long long> scans_dev_;  // [kNonFiniteSlots]
  cuda::PinnedBuffer<unsigned long long> scans_host_;
  int64_t n_scans_ = 0;
  std::vector<int64_t> scans_;

  // The lm_head's rows, computed into logits_dev_ by Logits, ArgMaxLogits or TopKLogits; what
  // reaches the host (after EndStep's one wait): every row, each row's arg-max key, or each
  // row's top-k candidates.
  cuda::DeviceBuffer<float> logits_dev_;
  // lm_head's product into logits_dev_ (unless replaying); false when it could not be sized.
  bool LmHead(const float* x, int64_t n_rows, const TensorView& lm_head);
  cuda::PinnedBuffer<float> logits_host_;
  float* logits_out_ = nullptr;  // Logits' destination, filled at EndStep
  cuda::DeviceBuffer<unsigned long long> argmax_dev_;
  cuda::PinnedBuffer<unsigned long long> argmax_host_;
  int32_t* argmax_out_ = nullptr;  // ArgMaxLogits' destination, filled at EndStep
  cuda::DeviceBuffer<uint8_t> topk_scratch_;
  cuda::DeviceBuffer<LogitCandidate> topk_dev_;  // [rows * kMaxLogitCandidates]
  cuda::DeviceBuffer<int32_t> topk_counts_dev_;
  cuda::PinnedBuffer<LogitCandidate> topk_host_;
  cuda::PinnedBuffer<int32_t> topk_counts_host_;
  // The step's Batch::draws, copied in by BeginStep; TopKLogits draws those rows' tokens.
  cuda::PinnedBuffer<RowDraw> draws_host_;
  cuda::DeviceBuffer<RowDraw> draws_dev_;
  cuda::DeviceBuffer<uint8_t> draw_scratch_;  // DrawScratchBytes of draws_dev_'s rows
  cuda::DrawWork step_draws_;
  LogitCandidate* topk_out_ = nullptr;  // TopKLogits' destinations, filled at EndStep
  int32_t* topk_counts_out_ = nullptr;
  // The step's Batch::scored, copied in by BeginStep (null: none); TopKLogits' sums of each row.
  const int32_t* scored_dev_ = nullptr;
  cuda::DeviceBuffer<RowLogSum> sums_dev_;
  cuda::PinnedBuffer<RowLogSum> sums_host_;
  RowLogSum* sums_out_ = nullptr;
  bool ReserveSums(size_t rows);  // false (error_ set) when they could not be sized
  int64_t out_rows_ = 0;          // rows of the four
};

}  // namespace moetier
