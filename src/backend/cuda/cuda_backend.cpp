#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/log.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/draw.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/log_sum_exp.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/top_k.h"

namespace moetier {

namespace {

// Steps are sized for this many tokens until a larger one comes (a whole prompt of a
// one-sequence client): enough for decode batches and prefill chunks of the default
// --max-batch-tokens.
constexpr int64_t kDefaultStepTokens = 512;
// memset(0x7f) of a scan slot: above any index, so "no non-finite element".
constexpr unsigned long long kNoNonFinite = 0x7f7f7f7f7f7f7f7full;

// A KV pool in VRAM; block copies (copy-on-write of a shared prefix) queue on the backend's
// stream, after the writes of the steps before.
class DeviceKvMemory final : public KvMemory {
 public:
  DeviceKvMemory(cuda::DeviceBuffer<uint8_t> b, cudaStream_t stream)
      : b_(std::move(b)), stream_(stream) {}
  uint8_t* data() const override { return b_.data(); }
  bool on_host() const override { return false; }
  void Copy(uint64_t dst, uint64_t src, uint64_t n) override {
    cudaMemcpyAsync(b_.data() + dst, b_.data() + src, n, cudaMemcpyDeviceToDevice, stream_);
  }
  // Host memory the engine owns (pageable): a synchronous copy on the stream's order.
  bool ToHost(uint64_t src, uint64_t n, void* dst) override {
    return cudaMemcpyAsync(dst, b_.data() + src, n, cudaMemcpyDeviceToHost, stream_) ==
               cudaSuccess &&
           cudaStreamSynchronize(stream_) == cudaSuccess;
  }
  bool FromHost(uint64_t dst, const void* src, uint64_t n) override {
    return cudaMemcpyAsync(b_.data() + dst, src, n, cudaMemcpyHostToDevice, stream_) ==
               cudaSuccess &&
           cudaStreamSynchronize(stream_) == cudaSuccess;
  }

 private:
  cuda::DeviceBuffer<uint8_t> b_;
  cudaStream_t stream_;
};

int64_t RoundUpPow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Decode steps of up to this many sequences are recorded as CUDA graphs (the attention's and
// the dense matmuls' decode kernels serve them; larger steps are long enough that launches do not
// dominate).
constexpr int64_t kMaxGraphTokens = 64;
// The smallest context the attention plan is made for. Steps plan for their longest context
// rounded up to a power of two (at least this): the decode steps of a sequence share one plan,
// and one recorded graph, for hundreds of positions, and a sequence's attention sums do not
// depend on another sequence's length within a bucket. The kernels read each token's own
// position; splits past it do nothing.
constexpr int64_t kMinContextBucket = 256;

int32_t PlannedMaxPosition(int32_t max_position) {
  const int64_t context = std::max(RoundUpPow2(int64_t{max_position} + 1), kMinContextBucket);
  return static_cast<int32_t>(context - 1);
}

}  // namespace

Status CudaBackend::CheckDims(const ModelDims& dims) {
  if (!cuda::AttentionHeadDimSupported(dims.head_dim))
    return Status::Error("--moe-backend gpu: head_dim " + std::to_string(dims.head_dim) +
                         " has no attention kernel (8, 16, 32, 64, 128 or 256); use "
                         "--moe-backend cpu");
  if (dims.n_experts > cuda::kMaxRouterExperts || dims.top_k > cuda::kMaxRouterTopK)
    return Status::Error("--moe-backend gpu: the GPU router takes at most " +
                         std::to_string(cuda::kMaxRouterExperts) + " experts and top-k " +
                         std::to_string(cuda::kMaxRouterTopK) + "; this model has " +
                         std::to_string(dims.n_experts) + " and " + std::to_string(dims.top_k));
  return OkStatus();
}

Expected<std::unique_ptr<ComputeBackend>> CudaBackend::Create(const ComputeOptions& options,
                                                              const ExpertSource& experts,
                                                              const ModelDims& dims) {
  if (!cuda::DeviceAvailable())
    return Status::Error("--moe-backend gpu: no CUDA device answers (driver missing or busy)");
  MT_CUDA_RETURN_IF_ERROR(cudaSetDevice(0), "selecting GPU 0");
  MT_RETURN_IF_ERROR(CheckDims(dims));
  std::unique_ptr<CudaBackend> b(new CudaBackend(experts, dims));
  MT_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&b->stream_), "creating a CUDA stream");
  MT_ASSIGN_OR_RETURN(b->offload_, ExpertOffload::Create(options, experts, dims));
  b->offload_->SetSegments(b.get());
  b->graphs_wanted_ = options.cuda_graphs;
  MT_ASSIGN_OR_RETURN(b->scans_dev_, cuda::DeviceBuffer<unsigned long long>::Create(
                                         kNonFiniteSlots, "the non-finite scans"));
  MT_RETURN_IF_ERROR(b->scans_host_.Reserve(kNonFiniteSlots, "the non-finite scans"));
  MT_ASSIGN_OR_RETURN(b->active_dev_, cuda::DeviceBuffer<int32_t>::Create(
                                          static_cast<size_t>(std::max<int64_t>(dims.n_layers, 1)),
                                          "the expert counts"));
  MT_RETURN_IF_ERROR(b->active_host_.Reserve(
      static_cast<size_t>(std::max<int64_t>(dims.n_layers, 1)), "the expert counts"));
  MT_RETURN_IF_ERROR(
      b->Reserve(options.max_step_tokens > 0 ? options.max_step_tokens : kDefaultStepTokens));
  return std::unique_ptr<ComputeBackend>(std::move(b));
}

CudaBackend::CudaBackend(const ExpertSource& experts, const ModelDims& dims)
    : experts_(experts), dims_(dims) {}

CudaBackend::~CudaBackend() {
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture) (void)graphs_.FinishCapture(stream_, true);
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : expert_events_) cudaEventDestroy(e);
}

void CudaBackend::Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess && error_.empty())
    error_ = std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

Status CudaBackend::Hold(std::span<const TensorView* const> matrices,
                         std::span<const std::vector<float>* const> vectors) {
  MT_RETURN_IF_ERROR(weights_.AddDense(matrices, vectors));
  MT_RETURN_IF_ERROR(HoldQuantizedNorms(matrices));
  vram_layers_.clear();
  int64_t shape_layer = -1;  // the first layer whose experts the GPU computes
  for (int64_t layer : dims_.moe_layers) {
    const ExpertHome home = offload_->home(layer);
    if (home == ExpertHome::kVram) vram_layers_.push_back(layer);
    if ((home != ExpertHome::kCpuExecutor || offload_->stageable(layer)) && shape_layer < 0)
      shape_layer = layer;
  }
  MT_RETURN_IF_ERROR(
      weights_.AddExperts(experts_, vram_layers_, shape_layer, dims_.n_layers, dims_.n_experts));
  graphs_enabled_ = graphs_wanted_ && !offload_->cpu_share_on_worker();
  LogInfo("gpu: " + std::to_string(weights_.bytes() >> 20) + " MiB of weights in VRAM");
  return Reserve(capacity_tokens_);  // the expert kernels' scratch, now that the shape is known
}

Status CudaBackend::HoldQuantizedNorms(std::span<const TensorView* const> matrices) {
  const int64_t H = dims_.d_model;
  const bool wanted =
      cuda::FusedNorms() && cuda::NormQuantizes(H) &&
      std::any_of(matrices.begin(), matrices.end(), [&](auto* m) {
        return IsBlockQuantized(m->dtype) && m->shape.size() == 2 && m->shape[1] == H;
      });
  if (!wanted || normed_acts_.q != nullptr) return OkStatus();
  const auto rows = static_cast<size_t>(cuda::DenseMatMul::kMaxDecodeTokens);
  MT_ASSIGN_OR_RETURN(normed_q_, cuda::DeviceBuffer<int8_t>::Create(rows * static_cast<size_t>(H),
                                                                    "quantized normed rows"));
  MT_ASSIGN_OR_RETURN(normed_d_, cuda::DeviceBuffer<float>::Create(
                                     rows * static_cast<size_t>(H / 32), "quantized normed rows"));
  normed_acts_ = {normed_q_.data(), normed_d_.data()};
  return OkStatus();
}

cuda::QuantizedActs CudaBackend::QuantizedNormOut(const float* y, int64_t n_rows, int64_t d) {
  const bool fits = normed_acts_.q != nullptr && d == dims_.d_model &&
                    n_rows <= cuda::DenseMatMul::kMaxDecodeTokens;
  normed_q_of_ = fits ? y : nullptr;
  normed_q_rows_ = n_rows;
  return fits ? normed_acts_ : cuda::QuantizedActs{};
}

const cuda::QuantizedActs* CudaBackend::QuantizedInput(const float* x, int64_t n_rows) {
  if (x == nullptr || x != normed_q_of_ || n_rows != normed_q_rows_) return nullptr;
  return &normed_acts_;
}

void CudaBackend::SetExpertStats(ExpertStats* stats) {
  stats_ = stats;
  offload_->SetExpertStats(stats);
}

Status CudaBackend::Reserve(int64_t n_tokens) {
  const bool experts_known = weights_.expert_shape().d_model > 0;
  if (n_tokens <= capacity_tokens_ && (!experts_known || ffn_built_)) return OkStatus();
  BuffersMoving();
  MT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "waiting for the GPU");
  const int64_t T = std::max(RoundUpPow2(n_tokens), capacity_tokens_);
  const int64_t H = dims_.d_model;
  const int64_t qkv = dims_.n_heads * dims_.head_dim;
  const int64_t max_cols = std::max({H, qkv, dims_.dense_width});
  const int64_t max_rows = std::max({dims_.vocab, qkv, H, dims_.dense_width, dims_.n_experts});
  MT_ASSIGN_OR_RETURN(dense_, cuda::DenseMatMul::Create(T, max_cols, max_rows));
  if (experts_known) {
    MT_ASSIGN_OR_RETURN(ffn_, cuda::ExpertFfn::Create(weights_.expert_shape(), T, dims_.top_k));
    ffn_built_ = true;
  }
  const int64_t E = std::max<int64_t>(dims_.n_experts, 1);
  const int64_t K = std::max<int64_t>(dims_.top_k, 1);
  const auto n_assign = static_cast<size_t>(T * K);
  MT_ASSIGN_OR_RETURN(router_logits_, cuda::DeviceBuffer<float>::Create(static_cast<size_t>(T * E),
                                                                        "the router logits"));
  MT_ASSIGN_OR_RETURN(topk_ids_, cuda::DeviceBuffer<int32_t>::Create(n_assign, "the routing"));
  MT_ASSIGN_OR_RETURN(topk_weights_, cuda::DeviceBuffer<float>::Create(n_assign, "the routing"));
  // n_active, experts [E], begin [E + 1], token_of and assign_of [T * K] (in this order:
  // ExpertOffload reads the first four back in one copy).
  MT_ASSIGN_OR_RETURN(routing_ints_,
                      cuda::DeviceBuffer<int32_t>::Create(
                          1 + static_cast<size_t>(2 * E + 1) + 2 * n_assign, "the routing"));
  MT_ASSIGN_OR_RETURN(routing_weights_, cuda::DeviceBuffer<float>::Create(n_assign, "the routing"));
  int32_t* ints = routing_ints_.data();
  routing_.top_k = dims_.top_k;
  routing_.n_experts = dims_.n_experts;
  routing_.n_active = ints;
  routing_.experts = ints + 1;
  routing_.begin = ints + 1 + E;
  routing_.token_of = ints + 1 + 2 * E + 1;
  routing_.assign_of = routing_.token_of + n_assign;
  routing_.weight_of = routing_weights_.data();
  capacity_tokens_ = T;
  return OkStatus();
}

uint64_t CudaBackend::KvMemoryFree() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return free;
}

Expected<std::unique_ptr<KvMemory>> CudaBackend::AllocateKv(uint64_t n_bytes) {
  MT_ASSIGN_OR_RETURN(cuda::DeviceBuffer<uint8_t> b,
                      cuda::DeviceBuffer<uint8_t>::Create(
                          n_bytes, "the KV cache (lower --ctx-size or --kv-cache-gb)"));
  // The expert cache takes what the weights, the KV pool and the workspace leave.
  MT_RETURN_IF_ERROR(offload_->AllocateCache());
  return std::unique_ptr<KvMemory>(new DeviceKvMemory(std::move(b), stream_));
}

void CudaBackend::BeginStep(const Batch& batch, const KvPool& kv, StepOutput output) {
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture)  // a step that never reached EndStep
    (void)graphs_.FinishCapture(stream_, true);
  graph_mode_ = cuda::StepGraphs::Mode::kEager;
  step_recorded_ = false;
  error_.clear();
  normed_q_of_ = nullptr;
  logits_out_ = nullptr;
  argmax_out_ = nullptr;
  topk_out_ = nullptr;
  topk_counts_out_ = nullptr;
  sums_out_ = nullptr;
  // The runtime's last error is where a refused kernel launch (too many threads or registers,
  // too much shared memory) shows: EndStep reads it. One left by calls outside the step, which
  // reported theirs, is not this step's.
  (void)cudaGetLastError();
  const int64_t T = batch.n_tokens();
  if (Status s = Reserve(T); !s.ok()) error_ = s.message();
  int64_t max_blocks = 1;
  for (const auto& table : batch.block_tables)
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(table.size()));
  // The tables' stride, bucketed like the context and no smaller than its smallest bucket: a
  // sequence's first kMinContextBucket positions share one recorded graph.
  const int64_t min_blocks = (kMinContextBucket + kv.block_size() - 1) / kv.block_size();
  max_blocks = std::max(RoundUpPow2(max_blocks), min_blocks);
  const size_t n_out = batch.logit_rows.size();
  const size_t n_seqs = batch.block_tables.size();
  const size_t n_scored = batch.scored.size();
  const size_t n =
      3 * static_cast<size_t>(T) + n_out + n_seqs * static_cast<size_t>(max_blocks) + n_scored;
  if (step_host_.size() < n) {
    BuffersMoving();
    Check(cudaStreamSynchronize(stream_), "waiting for the GPU");
    if (Status s = step_host_.Reserve(2 * n, "the step's indices"); !s.ok()) error_ = s.message();
    auto dev = cuda::DeviceBuffer<int32_t>::Create(2 * n, "the step's indices");
    if (dev.ok())
      step_dev_ = std::move(*dev);
    else
      error_ = dev.status().message();
  }
  if (!error_.empty()) return;
  int32_t* h = step_host_.data();
  std::copy(batch.tokens.begin(), batch.tokens.end(), h);
  std::copy(batch.positions.begin(), batch.positions.end(), h + T);
  std::copy(batch.seq_of.begin(), batch.seq_of.end(), h + 2 * T);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), h + 3 * T);
  int32_t* tables = h + 3 * T + n_out;
  std::fill(tables, tables + n_seqs * static_cast<size_t>(max_blocks), 0);
  int32_t max_position = 0;
  for (int32_t p : batch.positions) max_position = std::max(max_position, p);
  for (size_t s = 0; s < n_seqs; ++s)
    std::copy(batch.block_tables[s].begin(), batch.block_tables[s].end(),
              tables + s * static_cast<size_t>(max_blocks));
  std::copy(batch.scored.begin(), batch.scored.end(), h + n - n_scored);
  Check(cudaMemcpyAsync(step_dev_.data(), h, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        "copying the step's indices to the GPU");
  const int32_t* d = step_dev_.data();
  tokens_dev_ = d;
  logit_rows_dev_ = d + 3 * T;
  logit_rows_host_ = batch.logit_rows.data();
  batch_dev_.n_tokens = T;
  step_tokens_ = T;
  batch_dev_.positions = d + T;
  batch_dev_.seq_of = d + 2 * T;
  batch_dev_.block_tables = d + 3 * T + n_out;
  scored_dev_ = n_scored > 0 ? d + n - n_scored : nullptr;
  batch_dev_.max_blocks = max_blocks;
  batch_dev_.max_position = PlannedMaxPosition(max_position);
  step_draws_ = UploadDraws(batch);
  Check(cudaMemsetAsync(scans_dev_.data(), 0x7f, scans_dev_.bytes(), stream_),
        "clearing the non-finite scans");
  n_scans_ = 0;
  moe_calls_ = 0;
  if (Status s = offload_->BeginStep(T, stream_); !s.ok()) error_ = s.message();
  ChooseGraphMode(batch, kv, output);
}

cuda::DrawWork CudaBackend::UploadDraws(const Batch& batch) {
  const std::span<const RowDraw> draws = batch.draws;
  const cuda::DrawWork work = cuda::DrawWorkOf(draws);
  if (!work.any) return work;
  if (draws.size() != batch.logit_rows.size() || dims_.vocab > kMaxDrawVocab) {
    error_ = "a step's draws must be one a logit row, of a vocabulary of at most " +
             std::to_string(kMaxDrawVocab) + " tokens";
    return {};
  }
  if (draws_dev_.size() < draws.size()) {
    BuffersMoving();
    Check(cudaStreamSynchronize(stream_), "waiting for the GPU");
    const size_t rows = 2 * draws.size();
    auto dev = cuda::DeviceBuffer<RowDraw>::Create(rows, "the step's draws");
    auto scratch = cuda::DeviceBuffer<uint8_t>::Create(
        cuda::DrawScratchBytes(static_cast<int64_t>(rows)), "the draws' scratch");
    if (Status s = draws_host_.Reserve(rows, "the step's draws"); !s.ok())
      error_ = s.message();
    else if (!dev.ok())
      error_ = dev.status().message();
    else if (!scratch.ok())
      error_ = scratch.status().message();
    if (!error_.empty()) return {};
    draws_dev_ = std::move(*dev);
    draw_scratch_ = std::move(*scratch);
  }
  std::copy(draws.begin(), draws.end(), draws_host_.data());
  Check(cudaMemcpyAsync(draws_dev_.data(), draws_host_.data(), draws.size() * sizeof(RowDraw),
                        cudaMemcpyHostToDevice, stream_),
        "copying the step's draws to the GPU");
  return work;
}

void CudaBackend::ChooseGraphMode(const Batch& batch, const KvPool& kv, StepOutput output) {
  const int64_t T = batch.n_tokens();
  const bool decode = T <= kMaxGraphTokens &&
                      T == static_cast<int64_t>(batch.block_tables.size()) &&
                      T == static_cast<int64_t>(batch.logit_rows.size());
  if (!graphs_enabled_ || !decode || kv.on_host() || times_ != nullptr || router_logits_expected_ ||
      offload_->streaming() || !error_.empty())
    return;
  if (offload_->buffer_generation() != offload_generation_) {
    graphs_.Invalidate();
    offload_generation_ = offload_->buffer_generation();
  }
  segment_key_ = cuda::StepGraphs::Key{T,
                                       batch_dev_.max_blocks,
                                       batch_dev_.max_position,
                                       kv.base(),
                                       kv.n_blocks(),
                                       kv.block_size(),
                                       static_cast<int>(kv.dtype()),
                                       static_cast<int>(output)};
  segment_key_.draws = step_draws_;
  segment_key_.scored = scored_dev_ != nullptr;
  step_recorded_ = true;
  BeginSegment();
}

void CudaBackend::BeginSegment() {
  Expected<cuda::StepGraphs::Mode> mode = graphs_.Begin(segment_key_, stream_);
  if (mode.ok())
    graph_mode_ = *mode;
  else
    error_ = mode.message();
}

void CudaBackend::Pause() {
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture) FinishCapture();
  graph_mode_ = cuda::StepGraphs::Mode::kEager;
}

void CudaBackend::Resume(int variant) {
  if (!step_recorded_ || !error_.empty()) return;
  ++segment_key_.segment;
  segment_key_.variant = variant;
  BeginSegment();
}

void CudaBackend::BuffersMoving() {
  if (graph_mode_ != cuda::StepGraphs::Mode::kEager && error_.empty())
    error_ =
        "a device buffer grew inside a recorded decode step (MOETIER_CUDA_GRAPHS=0 turns "
        "the recording off)";
  graphs_.Invalidate();
  normed_q_of_ = nullptr;  // its buffer may be freed, and its address reused
}

void CudaBackend::FinishCapture() {
  const bool failed = !error_.empty();
  if (Status s = graphs_.FinishCapture(stream_, failed); !s.ok() && error_.empty())
    error_ = s.message() + " (MOETIER_CUDA_GRAPHS=0 turns the recording off)";
  graph_mode_ = cuda::StepGraphs::Mode::kEager;
}

float* CudaBackend::Activations(Act slot, int64_t n_tokens, int64_t width) {
  cuda::DeviceBuffer<float>& b = acts_[static_cast<size_t>(slot)];
  const auto n = static_cast<size_t>(std::max(n_tokens, capacity_tokens_) * width);
  if (b.size() < n) {
    BuffersMoving();
    Check(cudaStreamSynchronize(stream_), "waiting for the GPU");
    auto made = cuda::DeviceBuffer<float>::Create(n, "activations");
    if (made.ok())
      b = std::move(*made);
    else if (error_.empty())
      error_ = made.status().message();
  }
  return b.data();
}

void CudaBackend::Embed(const TensorView& table, std::span<const int32_t> tokens, float* h) {
  if (Replaying()) return;
  cuda::LaunchEmbed(weights_.Matrix(table), tokens_dev_, static_cast<int64_t>(tokens.size()), h,
                    stream_);
}

void CudaBackend::RmsNorm(const float* x, int64_t n_rows, std::span<const int32_t> rows,
                          const std::vector<float>& weight, float eps, int64_t d, float* y) {
  const int32_t* rows_dev = nullptr;
  if (!rows.empty()) {
    // The decoder picks rows only for the logits: the step's logit rows, already on the device.
    if (rows.data() != logit_rows_host_) {
      if (error_.empty()) error_ = "RmsNorm on the GPU takes only the step's logit rows";
      return;
    }
    rows_dev = logit_rows_dev_;
    n_rows = static_cast<int64_t>(rows.size());
  }
  const cuda::QuantizedActs yq = QuantizedNormOut(y, n_rows, d);
  if (Replaying()) return;
  cuda::LaunchRmsNorm(x, rows_dev, n_rows, weights_.Vector(weight), eps, d, y, stream_, yq);
}

void CudaBackend::Add(const float* x, int64_t n, float* y) {
  if (Replaying()) return;
  cuda::LaunchAdd(x, n, y, stream_);
}

void CudaBackend::AddRmsNorm(const float* x, int64_t n_rows, float* h,
                             const std::vector<float>& weight, float eps, int64_t d, float* y) {
  LaunchAddRmsNorm(x, n_rows, h, weight, eps, d, y, nullptr);
}

int64_t CudaBackend::AddRmsNormScan(const float* x, int64_t n_rows, float* h,
                                    const std::vector<float>& weight, float eps, int64_t d,
                                    float* y, int64_t slot) {
  if (!cuda::FusedNorms() || slot < 0 || slot >= kNonFiniteSlots) {
    AddRmsNorm(x, n_rows, h, weight, eps, d, y);
    return ScanNonFinite(h, n_rows * d, slot);
  }
  n_scans_ = std::max(n_scans_, slot + 1);
  LaunchAddRmsNorm(x, n_rows, h, weight, eps, d, y, scans_dev_.data() + slot);
  return -1;
}

void CudaBackend::LaunchAddRmsNorm(const float* x, int64_t n_rows, float* h,
                                   const std::vector<float>& weight, float eps, int64_t d, float* y,
                                   unsigned long long* first) {
  const cuda::QuantizedActs yq = QuantizedNormOut(y, n_rows, d);
  if (Replaying()) return;
  cuda::LaunchAddRmsNorm(x, n_rows, h, weights_.Vector(weight), eps, d, y, stream_, first, yq);
}

void CudaBackend::MatMul(const float* x, int64_t n_tokens, std::span<const MatMulOut> targets) {
  if (Replaying()) return;
  std::array<cuda::DeviceMatrix, 4> matrices;
  std::array<cuda::DenseMatMul::Product, 4> products;
  if (targets.size() > products.size()) {
    for (const MatMulOut& t : targets) dense_.Run(weights_.Matrix(*t.w), x, n_tokens, t.y, stream_);
    return;
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    matrices[i] = weights_.Matrix(*targets[i].w);
    products[i] = {&matrices[i], targets[i].y};
  }
  dense_.RunAll(std::span(products.data(), targets.size()), x, n_tokens, stream_,
                QuantizedInput(x, n_tokens));
}

void CudaBackend::SiluMul(float* gate, const float* up, int64_t n) {
  if (Replaying()) return;
  cuda::LaunchSiluMul(gate, up, n, stream_);
}

void CudaBackend::Attend(const AttentionWeights& w, const AttentionShape& shape, const Rope& rope,
                         int64_t layer, const Batch&, KvPool& kv, float* q, float* k, float* v,
                         float* out) {
  if (Replaying()) return;
  if (kv.on_host()) {  // a pool not made by this model (CausalLM::NewKvPool / NewCache)
    if (error_.empty()) error_ = "the KV pool is in host memory; the GPU needs one from NewKvPool";
    return;
  }
  if (inv_freq_.size() == 0) {
    BuffersMoving();
    std::vector<float> f(rope.inv_freq().begin(), rope.inv_freq().end());
    auto made = cuda::DeviceBuffer<float>::Create(f.size(), "the RoPE frequencies");
    if (!made.ok()) {
      if (error_.empty()) error_ = made.status().message();
      return;
    }
    inv_freq_ = std::move(*made);
    Check(cudaMemcpy(inv_freq_.data(), f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice),
          "copying the RoPE frequencies");
  }
  cuda::QkvPrologue p;
  p.q_bias = weights_.Vector(w.q_bias);
  p.k_bias = weights_.Vector(w.k_bias);
  p.v_bias = weights_.Vector(w.v_bias);
  p.q_norm = weights_.Vector(w.q_norm);
  p.k_norm = weights_.Vector(w.k_norm);
  p.inv_freq = inv_freq_.data();
  cuda::AttentionDims dims;
  dims.n_heads = shape.n_heads;
  dims.n_kv_heads = shape.n_kv_heads;
  dims.head_dim = shape.head_dim;
  dims.sliding_window = shape.sliding_window;
  dims.norm_eps = shape.norm_eps;
  cuda::DeviceKvPool pool;
  pool.dtype = kv.dtype();
  pool.n_layers = kv.shape().n_layers;
  pool.n_blocks = kv.n_blocks();
  pool.block_size = kv.block_size();
  pool.n_kv_heads = kv.shape().n_kv_heads;
  pool.head_dim = kv.shape().head_dim;
  pool.data = kv.base();
  // Scratch for the splits of long contexts: sized for the longest sequence the pool can hold,
  // at the first step (and again only if the steps grow).
  const size_t scratch =
      cuda::PagedAttentionScratchBytes(dims, capacity_tokens_, kv.n_blocks() * kv.block_size());
  if (attn_scratch_.size() < scratch) {
    BuffersMoving();
    Check(cudaStreamSynchronize(stream_), "waiting for the GPU");
    auto made = cuda::DeviceBuffer<uint8_t>::Create(scratch, "attention scratch");
    if (made.ok())
      attn_scratch_ = std::move(*made);
    else if (error_.empty())
      error_ = made.status().message();
  }
  cuda::LaunchAttentionPrologue(p, dims, batch_dev_, layer, pool, q, k, v, stream_);
  cuda::LaunchPagedAttention(dims, batch_dev_, layer, pool, q, out, attn_scratch_.data(),
                             attn_scratch_.size(), stream_);
}

void CudaBackend::Moe(const TensorView& router, const RouterOptions& opts, int64_t layer,
                      const float* x, int64_t n_tokens, float* out, float* router_logits) {
  const int64_t E = opts.n_experts;
  if (!offload_->GpuComputes(layer)) {
    if (Status s =
            offload_->RunOnCpu(router, opts, layer, x, n_tokens, out, router_logits, stream_);
        !s.ok() && error_.empty())
      error_ = s.message();
    return;
  }
  int64_t call = -1;  // this call's slot in the step's active-expert counts (read at EndStep)
  if (moe_calls_ < static_cast<int64_t>(active_host_.size())) {
    call = moe_calls_++;
    moe_call_layer_.resize(static_cast<size_t>(moe_calls_));
    moe_call_layer_[static_cast<size_t>(call)] = layer;
  }
  routing_.n_tokens = n_tokens;
  // A cached layer's Fetch ends the segment (the routing goes to the host) whether or not it
  // is replayed; a VRAM layer's launches all belong to the segment.
  const bool cached = offload_->Fetches(layer);
  if (Replaying() && !cached) return;
  if (!Replaying()) {
    dense_.Run(weights_.Matrix(router), x, n_tokens, router_logits_.data(), stream_);
    if (router_logits != nullptr) {
      Check(cudaMemcpyAsync(router_logits, router_logits_.data(),
                            static_cast<size_t>(n_tokens * E) * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_),
            "copying the router logits");
      Check(cudaStreamSynchronize(stream_), "waiting for the router logits");
    }
    cuda::LaunchRoute(router_logits_.data(), opts.normalize_top_k, topk_ids_.data(),
                      topk_weights_.data(), routing_, stream_);
  }
  RunExpertsOnGpu(layer, x, out, call >= 0 ? active_dev_.data() + call : nullptr);
}

void CudaBackend::RunExpertsOnGpu(int64_t layer, const float* x, float* out,
                                  int32_t* active_record) {
  cuda::ExpertPointers* table = weights_.ExpertTable(layer);
  const bool cached = offload_->Fetches(layer);
  if (cached) {
    if (!error_.empty()) return;  // the routing may be garbage: copy nothing
    if (Status s = offload_->Fetch(layer, routing_, x, table, stream_); !s.ok()) {
      error_ = s.message();
      return;
    }
  }
  TimeExperts(layer, true);
  const cuda::QuantizedActs* x8 =
      cuda::NormsFeedExperts() ? QuantizedInput(x, routing_.n_tokens) : nullptr;
  if (!cached) {  // (never replaying here: Moe left already)
    ffn_.Run(routing_, table, x, out, stream_, active_record, x8);
    TimeExperts(layer, false);
    return;
  }
  ffn_.RunExperts(routing_, table, x, stream_, x8);
  TimeExperts(layer, false);
  // Hybrid: the CPU computes its share of the misses while the GPU runs the launches above.
  Expected<const float*> cpu = offload_->ComputeCpuShare(layer, stream_);
  if (!cpu.ok()) {
    error_ = cpu.message();
    return;
  }
  if (!Replaying()) ffn_.RoutedSum(routing_, *cpu, out, stream_, active_record);
}

void CudaBackend::SetPhaseTimes(PhaseTimes* times) {
  times_ = times;
  offload_->SetPhaseTimes(times);
  if (times == nullptr || !expert_events_.empty()) return;
  expert_events_.resize(2 * static_cast<size_t>(dims_.n_layers));
  for (cudaEvent_t& e : expert_events_) Check(cudaEventCreate(&e), "creating the timing events");
}

void CudaBackend::TimeExperts(int64_t layer, bool start) {
  if (times_ == nullptr || expert_events_.empty()) return;
  Check(cudaEventRecord(expert_events_[static_cast<size_t>(2 * layer + (start ? 0 : 1))], stream_),
        "timing the experts");
  if (!start) timed_expert_layers_.push_back(layer);
}

int64_t CudaBackend::ScanNonFinite(const float* x, int64_t n, int64_t slot) {
  if (slot >= 0 && slot < kNonFiniteSlots) {
    if (!Replaying()) cuda::LaunchFirstNonFinite(x, n, scans_dev_.data() + slot, stream_);
    n_scans_ = std::max(n_scans_, slot + 1);
  }
  return -1;
}

Status CudaBackend::EndStep() {
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture) {  // no Logits: nothing to replay
    if (error_.empty()) error_ = "a recorded decode step had no logits";
    FinishCapture();
  }
  graph_mode_ = cuda::StepGraphs::Mode::kEager;
  step_recorded_ = false;
  Check(cudaMemcpyAsync(scans_host_.data(), scans_dev_.data(),
                        static_cast<size_t>(n_scans_) * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost, stream_),
        "reading the non-finite scans");
  Check(cudaMemcpyAsync(active_host_.data(), active_dev_.data(),
                        static_cast<size_t>(moe_calls_) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                        stream_),
        "reading the expert counts");
  Check(cudaStreamSynchronize(stream_), "the step on the GPU");
  Check(cudaGetLastError(), "a kernel launch of the step");
  if (error_.empty())
    if (Status s = offload_->FinishStep(); !s.ok()) error_ = s.message();
  for (int64_t layer : timed_expert_layers_) {
    float ms = 0.0f;
    const auto l = static_cast<size_t>(2 * layer);
    Check(cudaEventElapsedTime(&ms, expert_events_[l], expert_events_[l + 1]),
          "reading the experts' time");
    if (times_ != nullptr) (*times_)[Phase::kGpuExperts] += static_cast<double>(ms) * 1e-3;
  }
  timed_expert_layers_.clear();
  if (!error_.empty()) return Status::Error("GPU: " + error_);
  if (logits_out_ != nullptr)
    std::memcpy(logits_out_, logits_host_.data(),
                static_cast<size_t>(out_rows_ * dims_.vocab) * sizeof(float));
  if (argmax_out_ != nullptr)
    for (int64_t r = 0; r < out_rows_; ++r)
      argmax_out_[r] = cuda::ArgMaxKeyIndex(argmax_host_.data()[r]);
  if (topk_out_ != nullptr) {
    std::memcpy(topk_out_, topk_host_.data(),
                static_cast<size_t>(out_rows_ * kMaxLogitCandidates) * sizeof(LogitCandidate));
    std::memcpy(topk_counts_out_, topk_counts_host_.data(),
                static_cast<size_t>(out_rows_) * sizeof(int32_t));
  }
  if (sums_out_ != nullptr)
    std::memcpy(sums_out_, sums_host_.data(), static_cast<size_t>(out_rows_) * sizeof(RowLogSum));
  logits_out_ = nullptr;
  argmax_out_ = nullptr;
  topk_out_ = nullptr;
  topk_counts_out_ = nullptr;
  sums_out_ = nullptr;
  scans_.assign(static_cast<size_t>(n_scans_), -1);
  for (int64_t i = 0; i < n_scans_; ++i) {
    const unsigned long long v = scans_host_.data()[i];
    if (v < kNoNonFinite) scans_[static_cast<size_t>(i)] = static_cast<int64_t>(v);
  }
  for (int64_t i = 0; i < moe_calls_; ++i) {
    const int32_t n_active = active_host_.data()[i];
    active_experts_ += n_active;
    if (stats_ == nullptr) continue;
    LayerExpertStats d;
    d.layer = moe_call_layer_[static_cast<size_t>(i)];
    d.calls = 1;
    d.active_experts = n_active;
    d.gpu_experts = n_active - offload_->StepCpuExperts(d.layer);
    d.assignments = step_tokens_ * dims_.top_k;
    stats_->Add(d);
  }
  moe_calls_ = 0;
  return OkStatus();
}

int64_t CudaBackend::TakeActiveExperts() {
  return std::exchange(active_experts_, 0) + offload_->TakeActiveExperts();
}

bool CudaBackend::LmHead(const float* x, int64_t n_rows, const TensorView& lm_head) {
  const auto n = static_cast<size_t>(n_rows * dims_.vocab);
  if (logits_dev_.size() < n) {
    BuffersMoving();
    auto made = cuda::DeviceBuffer<float>::Create(n, "the logits");
    if (!made.ok()) {
      if (error_.empty()) error_ = made.status().message();
      return false;
    }
    logits_dev_ = std::move(*made);
  }
  if (!Replaying())
    dense_.Run(weights_.Matrix(lm_head), x, n_rows, logits_dev_.data(), stream_,
               QuantizedInput(x, n_rows));
  out_rows_ = n_rows;
  return true;
}

void CudaBackend::Logits(const float* x, int64_t n_rows, const TensorView& lm_head, float* logits) {
  const auto n = static_cast<size_t>(n_rows * dims_.vocab);
  if (Status s = logits_host_.Reserve(n, "the logits"); !s.ok()) {
    if (error_.empty()) error_ = s.message();
    return;
  }
  if (!LmHead(x, n_rows, lm_head)) return;
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture) FinishCapture();
  Check(cudaMemcpyAsync(logits_host_.data(), logits_dev_.data(), n * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "copying the logits");
  logits_out_ = logits;
}

void CudaBackend::ArgMaxLogits(const float* x, int64_t n_rows, const TensorView& lm_head,
                               int32_t* ids, int64_t scan_slot) {
  const auto rows = static_cast<size_t>(n_rows);
  if (argmax_dev_.size() < rows) {
    BuffersMoving();
    auto made = cuda::DeviceBuffer<unsigned long long>::Create(rows, "the logits' arg-max");
    if (!made.ok()) {
      if (error_.empty()) error_ = made.status().message();
      return;
    }
    argmax_dev_ = std::move(*made);
  }
  if (Status s = argmax_host_.Reserve(rows, "the logits' arg-max"); !s.ok()) {
    if (error_.empty()) error_ = s.message();
    return;
  }
  if (!LmHead(x, n_rows, lm_head)) return;
  const bool scanned = scan_slot >= 0 && scan_slot < kNonFiniteSlots;
  if (!Replaying())
    cuda::LaunchArgMaxRows(logits_dev_.data(), n_rows, dims_.vocab, argmax_dev_.data(),
                           scanned ? scans_dev_.data() + scan_slot : nullptr, stream_);
  if (scanned) n_scans_ = std::max(n_scans_, scan_slot + 1);
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture) FinishCapture();
  Check(cudaMemcpyAsync(argmax_host_.data(), argmax_dev_.data(), rows * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost, stream_),
        "copying the logits' arg-max");
  argmax_out_ = ids;
}

void CudaBackend::TopKLogits(const float* x, int64_t n_rows, const TensorView& lm_head,
                             LogitCandidate* cands, int32_t* counts, RowLogSum* sums,
                             int64_t scan_slot) {
  const auto rows = static_cast<size_t>(n_rows);
  const size_t n_cands = rows * kMaxLogitCandidates;
  if (topk_dev_.size() < n_cands || topk_scratch_.size() < cuda::TopKScratchBytes(n_rows)) {
    BuffersMoving();
    auto scratch = cuda::DeviceBuffer<uint8_t>::Create(cuda::TopKScratchBytes(n_rows),
                                                       "the logits' top-k scratch");
    auto dev = cuda::DeviceBuffer<LogitCandidate>::Create(n_cands, "the logits' top-k");
    auto dev_counts = cuda::DeviceBuffer<int32_t>::Create(rows, "the logits' top-k");
    for (const Status& s : {scratch.status(), dev.status(), dev_counts.status()}) {
      if (!s.ok()) {
        if (error_.empty()) error_ = s.message();
        return;
      }
    }
    topk_scratch_ = std::move(*scratch);
    topk_dev_ = std::move(*dev);
    topk_counts_dev_ = std::move(*dev_counts);
  }
  if (sums != nullptr && !ReserveSums(rows)) return;
  for (const Status& s : {topk_host_.Reserve(n_cands, "the logits' top-k"),
                          topk_counts_host_.Reserve(rows, "the logits' top-k")}) {
    if (!s.ok()) {
      if (error_.empty()) error_ = s.message();
      return;
    }
  }
  if (!LmHead(x, n_rows, lm_head)) return;
  const bool scanned = scan_slot >= 0 && scan_slot < kNonFiniteSlots;
  unsigned long long* first = scanned ? scans_dev_.data() + scan_slot : nullptr;
  if (!Replaying() && !step_draws_.every_row)  // a drawn row reads only its token
    cuda::LaunchTopKRows(logits_dev_.data(), n_rows, dims_.vocab, kMaxCandidateTopK,
                         topk_scratch_.data(), topk_dev_.data(), topk_counts_dev_.data(), first,
                         stream_);
  if (!Replaying())
    cuda::LaunchDrawRows(logits_dev_.data(), n_rows, dims_.vocab, draws_dev_.data(), step_draws_,
                         draw_scratch_.data(), topk_dev_.data(), topk_counts_dev_.data(), first,
                         stream_);
  if (!Replaying() && sums != nullptr)
    cuda::LaunchLogSumExpRows(logits_dev_.data(), n_rows, dims_.vocab, scored_dev_,
                              sums_dev_.data(), stream_);
  if (scanned) n_scans_ = std::max(n_scans_, scan_slot + 1);
  if (graph_mode_ == cuda::StepGraphs::Mode::kCapture) FinishCapture();
  if (sums != nullptr)
    Check(cudaMemcpyAsync(sums_host_.data(), sums_dev_.data(), rows * sizeof(RowLogSum),
                          cudaMemcpyDeviceToHost, stream_),
          "copying the logits' sums");
  sums_out_ = sums;
  Check(cudaMemcpyAsync(topk_host_.data(), topk_dev_.data(), n_cands * sizeof(LogitCandidate),
                        cudaMemcpyDeviceToHost, stream_),
        "copying the logits' top-k");
  Check(cudaMemcpyAsync(topk_counts_host_.data(), topk_counts_dev_.data(), rows * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream_),
        "copying the logits' top-k");
  topk_out_ = cands;
  topk_counts_out_ = counts;
}

bool CudaBackend::ReserveSums(size_t rows) {
  if (sums_dev_.size() < rows) {
    BuffersMoving();
    auto dev = cuda::DeviceBuffer<RowLogSum>::Create(rows, "the logits' sums");
    if (!dev.ok()) {
      if (error_.empty()) error_ = dev.status().message();
      return false;
    }
    sums_dev_ = std::move(*dev);
  }
  if (Status s = sums_host_.Reserve(rows, "the logits' sums"); !s.ok()) {
    if (error_.empty()) error_ = s.message();
    return false;
  }
  return true;
}

Status CudaBackend::CopyLogitsRow(int64_t r, float* out) {
  if (r < 0 || r >= out_rows_)
    return Status::Error("no logits row " + std::to_string(r) + " kept from the last step");
  MT_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out, logits_dev_.data() + r * dims_.vocab,
                 static_cast<size_t>(dims_.vocab) * sizeof(float), cudaMemcpyDeviceToHost),
      "copying a row of logits");
  return OkStatus();
}

}  // namespace moetier
