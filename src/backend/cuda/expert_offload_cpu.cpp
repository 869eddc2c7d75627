// ExpertOffload's CPU side (expert_offload.h): the CPU executor's threads, hybrid's share of a
// step's misses (on the host thread, or on a worker the stream waits for), and the locked
// layers run inside a step.
#include <chrono>
#include <mutex>
#include <string>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/expert_offload.h"
#include "core/log.h"
#include "core/tuning.h"

namespace moetier {

namespace {

// The stream's wait for the CPU share's worker gives up after this long (the share of one layer
// takes milliseconds): a stuck CPU side becomes the step's error instead of a hang.
constexpr uint32_t kCpuShareTimeoutMs = 30000;
// Whether the CPU's share runs on the worker by default. Measured on the H200 (16 cores, one
// sequence): slower than on the host thread — bf16 272 vs 356 tokens/s, q4_0 the split's q*
// went to 0.98 — as the worker's job finishes late (it is the pool's caller and shares a core
// with the host thread, which spins in cudaStreamSynchronize), so the split's CPU rate drops
// and the copy engine takes nearly every miss. MOETIER_CPU_SHARE_ASYNC=1 turns it on.
constexpr bool kCpuShareOnWorker = false;
// How long the CPU executor's threads spin for the next job under a split, µs: longer than a
// decode step's longest layer (all copies: up to ~20 ms at 16 bf16 sequences), so that through
// a decode they never sleep. Waking them costs far more than a share's job (30 µs an expert):
// 0.3-2 ms on the H200 machine's virtual CPUs. A share that paid for it would make the CPU look
// slow, the split would give it less, its jobs would come further apart and pay again; such
// shares are left out of the split's observations (CpuJobCounts), which needs most shares to
// find the threads awake: a spin shorter than the gap between shares leaves the CPU's rate
// unmeasured. Spinning costs nothing measurable there (docs/benchmarks.md, hybrid decode);
// idle, the threads sleep 50 ms after the last step.
constexpr int kCpuShareSpinMicros = 50000;

}  // namespace

void ExpertOffload::StartCpuSide(int n_threads) {
  cpu_ = std::make_unique<CpuBackend>(n_threads, experts_, dims_.d_model);
  if (!split_) return;
  if (!Tuning().spin_us) cpu_->pool().set_spin_micros(kCpuShareSpinMicros);
  if (Tuning().cpu_share_async.value_or(kCpuShareOnWorker ? 1 : 0) == 0) return;
  Expected<cuda::HostFlag> flag = cuda::HostFlag::Create();
  if (!flag.ok()) {
    LogInfo("gpu: " + flag.message() + "; the CPU's share of misses runs on the host thread");
    return;
  }
  cpu_done_ = std::make_unique<cuda::HostFlag>(std::move(*flag));
  cpu_worker_ = std::thread([this] { CpuWorkerLoop(); });
}

Expected<const float*> ExpertOffload::ComputeCpuShare(int64_t layer, cudaStream_t compute) {
  if (!split_step_ || cpu_routing_.experts.empty()) {
    ResumeSegment(0);
    return static_cast<const float*>(nullptr);
  }
  const int64_t n_tokens = cpu_routing_.n_tokens;
  const auto n = static_cast<size_t>(n_tokens * dims_.d_model);
  if (cpu_done_ != nullptr) {  // (the backend records no segments then)
    // The stream waits for the worker's flag, then copies its output; the host goes on.
    const uint32_t value = cpu_done_->Next();
    cpu_done_->QueueWait(value, kCpuShareTimeoutMs, compute);
    MT_RETURN_IF_ERROR(LayerStatus(cudaGetLastError(), "waiting for", layer, "'s CPU experts"));
    cpu_busy_.store(true);
    {
      std::lock_guard<std::mutex> lock(cpu_mu_);
      cpu_job_layer_ = layer;
      cpu_job_value_ = value;
    }
    cpu_cv_.notify_one();
  } else {
    RunCpuShare(layer);
    TakeCpuTimes();
  }
  ResumeSegment(1);
  if (!replaying())
    MT_RETURN_IF_ERROR(
        LayerStatus(cudaMemcpyAsync(partial_dev_.data(), out_host_.data(), n * sizeof(float),
                                    cudaMemcpyHostToDevice, compute),
                    "copying", layer, "'s CPU experts' output to the GPU"));
  return static_cast<const float*>(partial_dev_.data());
}

void ExpertOffload::RunCpuShare(int64_t layer) {
  // (The worker's time is added to the phase times by the host, in TakeCpuTimes.)
  const auto t0 = std::chrono::steady_clock::now();
  const bool counts = CpuJobCounts(t0);
  cpu_->executor().Run(layer, cpu_routing_, x_host_.data(), out_host_.data());
  const auto t1 = std::chrono::steady_clock::now();
  NoteCpuJobEnd(t1);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  if (!counts) {
    cpu_waking_ns_.fetch_add(ns);
    return;
  }
  cpu_ns_.fetch_add(ns);
  cpu_experts_.fetch_add(static_cast<int64_t>(cpu_routing_.experts.size()));
}

Status ExpertOffload::SettleCpuShare() {
  if (cpu_done_ != nullptr && (cpu_done_->TimedOut() || cpu_busy_.load()))
    return Status::Error(
        "hybrid: the CPU executor's share of a layer's experts did not finish "
        "within " +
        std::to_string(kCpuShareTimeoutMs / 1000) + " s");
  if (split_model_ != nullptr) TakeCpuTimes();
  return OkStatus();
}

bool ExpertOffload::CpuJobCounts(std::chrono::steady_clock::time_point now) const {
  if (cpu_->pool().spin_micros() < kCpuShareSpinMicros) return true;
  const int64_t end = cpu_job_end_ns_.load(std::memory_order_relaxed);
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  return end >= 0 && now_ns - end < int64_t{1000} * cpu_->pool().spin_micros();
}

void ExpertOffload::NoteCpuJobEnd(std::chrono::steady_clock::time_point end) {
  cpu_job_end_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count(),
      std::memory_order_relaxed);
}

void ExpertOffload::TakeCpuTimes() {
  const int64_t experts = cpu_experts_.exchange(0);
  const auto ns = static_cast<double>(cpu_ns_.exchange(0));
  const auto waking_ns = static_cast<double>(cpu_waking_ns_.exchange(0));
  if (experts > 0) split_model_->ObserveCpu(experts, ns);
  if (times_ != nullptr)
    (*times_)[cpu_done_ != nullptr ? Phase::kCpuShare : Phase::kCpuExperts] +=
        (ns + waking_ns) * 1e-9;
}

void ExpertOffload::CpuWorkerLoop() {
  std::unique_lock<std::mutex> lock(cpu_mu_);
  for (;;) {
    cpu_cv_.wait(lock, [&] { return cpu_stop_ || cpu_job_layer_ >= 0; });
    if (cpu_stop_) return;
    const int64_t layer = std::exchange(cpu_job_layer_, -1);
    const uint32_t value = cpu_job_value_;
    lock.unlock();
    RunCpuShare(layer);
    cpu_busy_.store(false);
    cpu_done_->Publish(value);
    lock.lock();
  }
}

Status ExpertOffload::RunOnCpu(const TensorView& router, const RouterOptions& opts, int64_t layer,
                               const float* x, int64_t n_tokens, float* out, float* router_logits,
                               cudaStream_t compute) {
  const auto n = static_cast<size_t>(n_tokens * dims_.d_model);
  MT_RETURN_IF_ERROR(ReserveHostRows(layer, n_tokens, compute));
  if (!replaying())
    MT_RETURN_IF_ERROR(LayerStatus(
        cudaMemcpyAsync(x_host_.data(), x, n * sizeof(float), cudaMemcpyDeviceToHost, compute),
        "copying", layer, "'s hidden states to the host"));
  PauseSegment();
  {
    ScopedPhase wait(times_, Phase::kGpuWait);
    MT_RETURN_IF_ERROR(
        LayerStatus(cudaStreamSynchronize(compute), "the GPU before", layer, "'s CPU experts"));
  }
  {
    ScopedPhase phase(times_, Phase::kCpuExperts);
    const auto t0 = std::chrono::steady_clock::now();
    cpu_->Moe(router, opts, layer, x_host_.data(), n_tokens, out_host_.data(), router_logits);
    NoteCpuJobEnd(std::chrono::steady_clock::now());
    const std::chrono::duration<double, std::nano> ns = std::chrono::steady_clock::now() - t0;
    // What the same layer costs the CPU executor in a step that could have staged it.
    if (stageable(layer) && n_tokens >= stream_min_tokens_)
      locked_prefill_->ObserveCpu(n_tokens, ns.count());
  }
  ResumeSegment(0);
  if (replaying()) return OkStatus();
  return LayerStatus(
      cudaMemcpyAsync(out, out_host_.data(), n * sizeof(float), cudaMemcpyHostToDevice, compute),
      "copying", layer, "'s expert output to the GPU");
}

}  // namespace moetier
