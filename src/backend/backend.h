// The device-neutral boundary between the decoder and the device that computes it: every
// operation of a forward pass over a batch (layers/ compose them into sublayers, model/ into
// the decoder). The CPU is the first implementation (backend/cpu/); a CUDA backend implements
// the same calls instead of forking the decoder.
//
// Activations are float32 buffers [n_tokens, width] that the backend owns and hands out by slot
// (host memory on the CPU, device memory on a GPU); callers pass them between calls and read
// their elements only through Logits-like results the backend returns to the host. Weights are
// TensorViews of whatever memory the backend was given (host maps, banks, VRAM).
//
// Contract: one thread calls at a time (the engine's); each call's results are complete when the
// next call that reads them runs (a GPU backend queues work on one stream and synchronizes
// where results reach the host: Logits, and the router logits when asked for).
//
// A forward step: BeginStep(batch), Embed, per layer RmsNorm/MatMul/Attend/Moe/Add...,
// ScanNonFinite after each layer, Logits (or ArgMaxLogits, TopKLogits), then EndStep, after
// which the logits, NonFiniteScans() and TakeActiveExperts() hold the step's results.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/batch.h"
#include "backend/kv_cache.h"
#include "backend/rope.h"
#include "core/logit_candidate.h"
#include "core/phase_times.h"
#include "core/status.h"
#include "core/tensor.h"
#include "experts/expert_stats.h"
#include "experts/routing.h"

namespace moetier {

struct AttentionShape {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: every earlier position
  float norm_eps = 1e-6f;      // for q_norm / k_norm
};

struct AttentionWeights {
  TensorView q, k, v;  // [n_heads * head_dim, d_model], [n_kv_heads * head_dim, d_model] x2
  TensorView o;        // [d_model, n_heads * head_dim]
  std::vector<float> q_bias, k_bias, v_bias;  // empty when the model has none
  std::vector<float> q_norm, k_norm;          // [head_dim]; empty when the model has none
};

// One matrix product of a batched MatMul: y [n_tokens, rows of w] = x · wᵀ.
struct MatMulOut {
  const TensorView* w = nullptr;
  float* y = nullptr;
};

// Activation buffers by use; each holds [n_tokens, width] floats as last asked.
enum class Act : size_t {
  kResidual,  // h, the residual stream [T, d_model]
  kNormed,    // the normed input of a sublayer [T, d_model]
  kDelta,     // a sublayer's output [T, d_model]
  kQ,         // [T, n_heads * head_dim]
  kK,         // [T, n_kv_heads * head_dim]
  kV,         // [T, n_kv_heads * head_dim]
  kAttn,      // attention output [T, n_heads * head_dim]
  kGate,      // a dense MLP's gate rows [T, width]
  kUp,        // and its up rows
  kCount
};

// Where the decoder's operations run (--moe-backend picks it; model/load.cpp).
enum class ComputeDevice {
  kCpu,  // every operation on the CPU's thread pool
  kGpu,  // every operation on the GPU (backend/cuda/); the experts where ExpertHome says
};

// Where a GPU backend finds a MoE layer's experts (the settled residency decides: load.cpp).
enum class ExpertHome {
  kVram,        // copied to VRAM at load (--moe-backend gpu)
  kGpuCache,    // a pinned host bank: misses copied into the VRAM expert cache (offload), or
                // with ComputeOptions::split_misses some computed by the CPU executor (hybrid)
  kCpuExecutor  // a locked or pageable bank: computed in place by the CPU executor (offload)
};

class ComputeBackend;
// Takes the backend a model was given and returns the one the model will call: a decorator that
// forwards every call to it and observes them (backend/prefetch_probe.h), or the backend itself.
using BackendWrapper =
    std::function<std::unique_ptr<ComputeBackend>(std::unique_ptr<ComputeBackend>)>;

struct ComputeOptions {
  int n_threads = 0;  // CPU threads (0: one per physical core)
  ComputeDevice device = ComputeDevice::kCpu;
  // kGpu: per layer id (size n_layers; non-MoE entries unused); empty: every layer kVram.
  std::vector<ExpertHome> expert_homes = {};
  // kGpu with kGpuCache layers: the VRAM expert cache's size (--moe-cache-gb); 0: the free VRAM
  // left once the weights, the KV cache and the workspace are in.
  uint64_t expert_cache_bytes = 0;
  // kGpu with packed (BF16C) pinned banks: the most experts their VRAM staging buffer holds
  // between copy and expansion; 0: a layer's where VRAM holds it beside the prefill stream
  // buffers, else kShortStagingExperts (expert_offload.cpp). Fewer than a layer's: no streaming.
  int64_t staging_experts = 0;
  // The most tokens one step may hold (--max-batch-tokens, or a whole prompt for a one-sequence
  // client): a GPU backend sizes its buffers once for it. 0: a default.
  int64_t max_step_tokens = 0;
  // kGpu with kGpuCache layers, --moe-backend hybrid: a decode step's misses are split between
  // the copy engine and the CPU executor (experts/miss_split.h) instead of all copied.
  bool split_misses = false;
  // ... the copy engine's share of them forced (0 to 1); negative: measured.
  double fetch_share = -1;
  // kGpu with every expert in VRAM: decode steps recorded as CUDA graphs and replayed.
  bool cuda_graphs = true;
  // kGpu with locked or pageable layers: their banks staged to the GPU for long prefill steps
  // (1), never (0), or when measured cheaper than the CPU executor (-1; experts/locked_prefill.h).
  int stage_locked = -1;
  // When set, MakeBackend hands the backend it made to it and returns its result (empty: the
  // backend as made).
  BackendWrapper wrap = {};
};

// What a backend sizes its buffers and tables for.
struct ModelDims {
  int64_t n_layers = 0;
  int64_t d_model = 0;
  int64_t vocab = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  double rope_theta = 10000.0;
  int64_t n_experts = 0;  // 0: no MoE layers
  int64_t top_k = 0;
  int64_t expert_width = 0;         // the routed experts' intermediate size
  int64_t dense_width = 0;          // the dense MLPs' intermediate size (0: none)
  std::vector<int64_t> moe_layers;  // the layers whose feed-forward is routed experts
};

// Which call ends a step: Logits (every row of logits to the host), ArgMaxLogits (each row's
// largest index only) or TopKLogits (each row's top-k candidates).
enum class StepOutput { kLogits, kArgMax, kTopK };

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // Every weight the decoder will pass to later calls, once, before the first step: a GPU
  // backend copies them to its memory and maps later calls' views (by their host address) to
  // its copies; the CPU uses them where they are.
  virtual Status Hold(std::span<const TensorView* const> matrices,
                      std::span<const std::vector<float>* const> vectors) = 0;
  // The MoE layers whose experts Hold copied to the backend's own memory: their host copies are
  // no longer read (the decoder frees them).
  virtual std::vector<int64_t> LayersWithOwnExperts() const { return {}; }
  // Bytes free now where this backend's KV pool would go (available RAM; free VRAM).
  virtual uint64_t KvMemoryFree() const = 0;
  // Memory for a KV pool of n_bytes: host memory on the CPU, device memory on a GPU.
  virtual Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) = 0;
  // The step's tokens, positions, sequences, block tables and logit rows, before its first
  // operation (a GPU backend copies them to the device once), the KV pool its Attend calls
  // will name, and which call ends it (a GPU records the two kinds of step apart).
  virtual void BeginStep(const Batch& batch, const KvPool& kv, StepOutput output) = 0;

  // A buffer for `slot` of at least n_tokens x width floats (contents unspecified; kept and
  // reused, so steady-state steps allocate nothing).
  virtual float* Activations(Act slot, int64_t n_tokens, int64_t width) = 0;

  // h[t] = table row tokens[t] (any dtype, as float32).
  virtual void Embed(const TensorView& table, std::span<const int32_t> tokens, float* h) = 0;
  // y[i] = RmsNorm(x[rows[i]]) · weight for each i (rows empty: every row of n_rows).
  virtual void RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
                       const std::vector<float>& weight, float eps, int64_t d, float* y) = 0;
  // y += x, n floats.
  virtual void Add(const float* x, int64_t n, float* y) = 0;
  // The residual add and the norm after it: h += x, then y = RmsNorm(h) · weight, n_rows rows of
  // d (a GPU fuses them; the same bits as Add then RmsNorm).
  virtual void AddRmsNorm(const float* x, int64_t n_rows, float* h,
                          const std::vector<float>& weight, float eps, int64_t d, float* y) {
    Add(x, n_rows * d, h);
    RmsNorm(h, n_rows, {}, weight, eps, d, y);
  }
  // AddRmsNorm, then ScanNonFinite(h, n_rows * d, slot) of the sums, returning what the scan
  // returns (a GPU scans them inside the norm's launch).
  virtual int64_t AddRmsNormScan(const float* x, int64_t n_rows, float* h,
                                 const std::vector<float>& weight, float eps, int64_t d, float* y,
                                 int64_t slot) {
    AddRmsNorm(x, n_rows, h, weight, eps, d, y);
    return ScanNonFinite(h, n_rows * d, slot);
  }
  // Every target's product with the same activations x [n_tokens, k] (one pass to prepare x).
  virtual void MatMul(const float* x, int64_t n_tokens, std::span<const MatMulOut> targets) = 0;
  // gate = silu(gate) ⊙ up, n floats.
  virtual void SiluMul(float* gate, const float* up, int64_t n) = 0;

  // The attention core after the q/k/v projections: biases, per-head q/k RMS norms, RoPE at
  // each token's position, this layer's K/V rows of every token into `kv` (so tokens of one
  // sequence in the batch see each other causally), then causal attention of each token over
  // its own sequence's positions. q, k, v are consumed; out [T, n_heads * head_dim].
  virtual void Attend(const AttentionWeights& w, const AttentionShape& shape, const Rope& rope,
                      int64_t layer, const Batch& batch, KvPool& kv, float* q, float* k, float* v,
                      float* out) = 0;

  // The routed-expert block of MoE layer `layer`: the router (logits, softmax, top-k, the
  // step's tokens grouped by expert), then every chosen expert's SwiGLU and the weighted sum:
  // out [n_tokens, d_model] (overwritten) for x [n_tokens, d_model]. router_logits, when not
  // null, receives the raw logits [n_tokens, n_experts] in host memory (tests against a
  // reference).
  virtual void Moe(const TensorView& router, const RouterOptions& opts, int64_t layer,
                   const float* x, int64_t n_tokens, float* out, float* router_logits) = 0;
  // The experts the Moe calls activated, summed over calls since the last TakeActiveExperts.
  virtual int64_t TakeActiveExperts() = 0;

  // Scans x[0, n) for NaN and infinity, result `slot` (< kNonFiniteSlots) of NonFiniteScans.
  // Returns the first non-finite index when known at once (the CPU), else -1 (a GPU defers the
  // answer to NonFiniteScans and keeps its kernels safe on non-finite input meanwhile).
  static constexpr int64_t kNonFiniteSlots = 1024;
  virtual int64_t ScanNonFinite(const float* x, int64_t n, int64_t slot) = 0;
  // Per slot scanned this step, the index of its first non-finite element or -1 (after EndStep).
  virtual std::span<const int64_t> NonFiniteScans() = 0;
  // Completes the step (a GPU waits for its stream and reads the scans and counts back); an
  // error of the device during the step (a failed launch or allocation) is returned here.
  virtual Status EndStep() = 0;

  // logits [n_rows, vocab] in host memory = x [n_rows, d_model] · lm_headᵀ, complete after
  // EndStep.
  virtual void Logits(const float* x, int64_t n_rows, const TensorView& lm_head, float* logits) = 0;
  // ids[r] (host memory, complete after EndStep) = kernels::ArgMax of row r of those logits,
  // which stay where they are computed (a GPU hands back n_rows ids, not the rows). Their first
  // non-finite element (row * vocab + column) goes to NonFiniteScans()[scan_slot].
  virtual void ArgMaxLogits(const float* x, int64_t n_rows, const TensorView& lm_head, int32_t* ids,
                            int64_t scan_slot) = 0;
  // Row r's candidates for any top-k up to kMaxCandidateTopK (core/logit_candidate.h) into
  // cands[r * kMaxLogitCandidates ...] and their number into counts[r] (host memory, complete
  // after EndStep): kernels::TopKCandidates with k = kMaxCandidateTopK, whose prefix of the
  // logits at least the k-th's is a smaller k's; -1 when they do not fit (then CopyLogitsRow).
  // A row the step's Batch::draws draws (u >= 0, where SelectsTopK) instead gets the token
  // drawn (kernels/cuda/draw.h) as its one candidate. The scan as ArgMaxLogits'. With `sums`
  // (not null where the step's Batch::scored is not empty), each row's RowLogSum into sums[r]
  // (host memory, complete after EndStep): kernels::LogSumExp of the row, Batch::scored[r]'s
  // logit.
  virtual void TopKLogits(const float* x, int64_t n_rows, const TensorView& lm_head,
                          LogitCandidate* cands, int32_t* counts, RowLogSum* sums,
                          int64_t scan_slot) = 0;
  // After a step that ended with ArgMaxLogits or TopKLogits, and before the next: row r of its
  // logits into out [vocab].
  virtual Status CopyLogitsRow(int64_t r, float* out) = 0;
  // Whether TopKLogits saves work over Logits (a GPU copies candidates instead of rows; the CPU
  // computes the rows either way and its sampler reads them as fast).
  virtual bool SelectsTopK() const { return false; }

  // Per-phase timing (bench --profile), or null.
  virtual void SetPhaseTimes(PhaseTimes* times) = 0;
  virtual PhaseTimes* phase_times() const = 0;
  // Per-layer expert counters (--moe-collect-stats), or null; added to by Moe (a GPU: at
  // EndStep).
  virtual void SetExpertStats(ExpertStats* stats) = 0;
  // Whether the steps from now on pass router_logits to Moe (a test's sink): a backend that
  // replays recorded steps records none while they do.
  virtual void ExpectRouterLogits(bool) {}
  // Steps replayed from a recording (CUDA graphs) rather than launched call by call.
  virtual int64_t ReplayedSteps() const { return 0; }
};

}  // namespace moetier
