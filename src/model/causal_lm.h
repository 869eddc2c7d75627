// CausalLM: a loaded model that turns token ids into logits, one architecture file each
// (model/arch/). Not thread-safe: one engine thread drives it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/batch.h"
#include "backend/kv_cache.h"
#include "core/phase_times.h"
#include "core/status.h"
#include "experts/residency_plan.h"
#include "experts/residency_report.h"
#include "experts/weight_packing.h"
#include "model/config.h"
#include "model/dense_holding.h"

namespace moetier {

enum class LogitsFor { kLastToken, kAllTokens };

// ForwardTopK's result: row r's candidates at cands[r * kMaxLogitCandidates ...], counts[r] of
// them (-1: the row did not fit); where the batch's Batch::scored was not empty, sums[r].
struct TopKRows {
  std::vector<LogitCandidate> cands;
  std::vector<int32_t> counts;
  std::vector<RowLogSum> sums;  // empty when Batch::scored was
  std::span<const LogitCandidate> Row(size_t r) const {
    return {cands.data() + r * kMaxLogitCandidates, static_cast<size_t>(counts[r])};
  }
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;

  // One step over a batch of tokens from any number of sequences, their K/V read from and
  // written to `kv` (the batch's block tables name the blocks); logits [batch.logit_rows.size(),
  // vocab], in logit_rows' order. A sequence's logits are bit-identical whatever else the batch
  // holds (at a fixed kernel level: AMX tiles sum batches differently from single rows).
  // Errors (an id outside the vocabulary, a block table too short, a non-finite activation) leave
  // the K/V rows of the step's positions undefined.
  virtual Status Forward(const Batch& batch, KvPool& kv, std::vector<float>& logits) = 0;
  // The same step for a caller that reads only each logit row's largest index (greedy sampling
  // without penalties): ids [batch.logit_rows.size()] = kernels::ArgMax of each row of the
  // logits Forward gives, the same errors; a GPU hands back the ids instead of the rows.
  virtual Status ForwardArgMax(const Batch& batch, KvPool& kv, std::vector<int32_t>& ids) = 0;
  // The same step for a caller whose draws read only each row's largest kMaxCandidateTopK
  // logits (top-k sampling without penalties): ComputeBackend::TopKLogits' candidates of each
  // row, the same errors; a row whose count is -1 is read with LogitsRow. Worth it where
  // CandidatesOnDevice(): a GPU hands back the candidates instead of the rows. With
  // Batch::scored, each row's log-sum-exp and scored token's logit too (TopKRows::sums).
  virtual Status ForwardTopK(const Batch& batch, KvPool& kv, TopKRows& out) = 0;
  virtual bool CandidatesOnDevice() const = 0;
  // After ForwardArgMax or ForwardTopK, before the next step: logit row r into out [vocab].
  virtual Status LogitsRow(int64_t r, std::vector<float>& out) = 0;
  // After a step that failed on a non-finite activation or logit: the sequence (a value of
  // Batch::seq_of) of the first token found so, which alone may end: no other sequence's
  // tokens read it (attention stays within a sequence, everything else within a token). -1
  // after a step that succeeded or failed otherwise.
  virtual int32_t NonFiniteSequence() const = 0;

  // One sequence on its own cache: runs `tokens` at positions cache.n_past() + t, appends their
  // K/V and writes logits: [1, vocab] for kLastToken, [tokens.size(), vocab] for kAllTokens.
  Status Forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                 std::vector<float>& logits);

  // Weight bytes one decode step reads: every dense matrix, the embedding row, and top-k experts
  // per MoE layer (the floor of the bytes a token costs; benchmarks divide by it).
  virtual uint64_t DecodeBytesPerToken() const = 0;
  // The weights (elements) behind those bytes: the same for every format, so another engine's
  // bytes per token follow from its format (bf16: 2 bytes a weight; Q8_0: 34/32).
  virtual uint64_t DecodeWeightsPerToken() const = 0;
  // Weight bytes every Forward so far has read (dense matrices once a step, the embedding rows
  // and the experts the steps chose): what benchmarks divide by time for the GB/s a batched
  // decode achieves.
  virtual uint64_t WeightBytesStreamed() const = 0;
  // Every weight byte as held: dense tensors and every expert of every MoE layer.
  virtual uint64_t WeightBytes() const = 0;
  // The dtype of the routed experts' weights.
  virtual DType expert_dtype() const = 0;

  // When set, MoE layers store their raw router logits [n_tokens, n_experts] in (*sink)[layer]
  // on each Forward (for checks against reference router logits). nullptr turns it off.
  virtual void SetRouterLogitsSink(std::vector<std::vector<float>>* sink) = 0;

  // When set, each Forward adds its wall time per phase into *times (moetier bench --profile).
  // nullptr (the default) turns it off.
  virtual void SetPhaseTimes(PhaseTimes* times) = 0;
  // From now on every Forward adds per-layer expert counters (--moe-collect-stats) into
  // expert_stats(), which is null until then.
  virtual void CollectExpertStats() = 0;
  virtual const ExpertStats* expert_stats() const = 0;
  // Forward steps the GPU replayed from a recorded CUDA graph (decode steps with every expert in
  // VRAM); 0 on the CPU.
  virtual int64_t ReplayedSteps() const = 0;

  // Where the expert banks were planned to live and where they settled (set by the loader).
  const ResidencyReport& residency() const { return residency_; }
  void set_residency(ResidencyReport r) { residency_ = std::move(r); }

  // The shape of this model's K/V rows.
  KvShape kv_shape() const {
    const ModelConfig& c = config();
    return KvShape{c.n_layers, c.n_kv_heads, c.head_dim};
  }
  // Where this model computes (--moe-backend gpu: the GPU).
  virtual ComputeDevice device() const = 0;
  // Bytes free now where a KV pool would go (available RAM, or free VRAM).
  virtual uint64_t KvMemoryFree() const = 0;
  // Memory for a KV pool of n_bytes where this model's attention reads it (RAM, or VRAM).
  virtual Expected<std::unique_ptr<KvMemory>> AllocateKv(uint64_t n_bytes) const = 0;
  // A pool of n_blocks blocks for this model's K/V rows, in its device's memory.
  Expected<KvPool> NewKvPool(int64_t n_blocks, int64_t block_size, DType dtype) const {
    return KvPool::Create(kv_shape(), n_blocks, block_size, dtype,
                          [this](uint64_t n_bytes) { return AllocateKv(n_bytes); });
  }
  // A single-sequence cache for this model holding up to max_positions positions.
  Expected<KvCache> NewCache(int64_t max_positions, DType kv_dtype = DType::kF32) const {
    return KvCache::Create(kv_shape(), max_positions, kv_dtype,
                           [this](uint64_t n_bytes) { return AllocateKv(n_bytes); });
  }

 private:
  ResidencyReport residency_;
  // The single-sequence Forward's batch, reused so a decode step allocates nothing.
  std::vector<int32_t> one_positions_, one_seq_of_, one_logit_rows_;
};

// How expert banks are placed: the flags of every command that loads a model.
struct ResidencyOptions {
  Backend backend = Backend::kAuto;  // --moe-backend
  BudgetFlags budgets;               // --pin-budget-gb, --lock-budget-gb
  std::string cpu_layers = "auto";   // --moe-cpu-layers
  uint64_t expert_cache_bytes = 0;   // --moe-cache-gb (0: the free VRAM after the rest)
  int64_t kv_positions = 0;          // --ctx-size: the KV cache auto must leave VRAM for (0: 8192)
  double fetch_share = -1;           // hybrid: the copy engine's share of misses (<0: measured)
  bool use_gpu = true;               // false (--no-gpu): as if no GPU were present
  bool verify = true;                // checksums of a converted model (--no-verify skips)
  int n_io_threads = 0;              // threads reading banks (0: a default)
  WeightPacking packing = WeightPacking::kAuto;   // --weight-packing
  DenseMemory dense_memory = DenseMemory::kAuto;  // --dense-memory
  // Pinned bf16 banks held as BF16C and expanded by the GPU after each copy (1), as stored (0),
  // or as MOETIER_PACK_PINNED says (-1; unset: packed).
  int pack_pinned = -1;
  // Packed pinned banks' VRAM staging buffer, in experts (ComputeOptions::staging_experts).
  int64_t staging_experts = 0;
};

struct LoadOptions {
  int n_threads = 0;  // 0: one per physical core; at most ThreadPool::MaxThreads()
  // The most tokens one Forward step will hold (a GPU sizes its buffers for it; 0: a default).
  int64_t max_step_tokens = 0;
  // --moe-backend gpu: decode steps recorded as CUDA graphs and replayed (false, or
  // MOETIER_CUDA_GRAPHS=0: every kernel launched from the host).
  bool cuda_graphs = true;
  // With a GPU, a long prefill step's locked layers: staged to the GPU (1), computed by the CPU
  // executor (0), or the cheaper as measured (-1: MOETIER_STAGE_LOCKED, else measured).
  int stage_locked = -1;
  // When set, the compute backend is handed to it and the model calls what it returns
  // (ComputeOptions::wrap): a decorator that observes the model's operations, e.g. the
  // prefetch_recall benchmark's PrefetchProbe.
  BackendWrapper wrap_backend = {};
  ResidencyOptions residency;
  // Called with the parsed config once the model directory has been opened and planned, before
  // a weight byte is read: where a front end checks what depends on the model (token ids
  // against the vocabulary, the context size), so a mistake costs milliseconds, not a load.
  std::function<Status(const ModelConfig&)> before_weights;
};

// Loads a model directory — a Hugging Face checkpoint (config.json + safetensors) or a converted
// one (moetier-index.json): parses the config, picks the architecture, plans each MoE layer's
// tier, fills its expert bank and settles it, maps the dense weights, and checks every tensor's
// presence, dtype and shape against the config before returning.
Expected<std::unique_ptr<CausalLM>> LoadCausalLM(const std::filesystem::path& dir,
                                                 const LoadOptions& options);

// The residency plan for the model in `dir` without reading a weight byte (moetier plan).
Expected<ResidencyReport> PlanModelResidency(const std::filesystem::path& dir,
                                             const ResidencyOptions& options);

}  // namespace moetier
