// Wall time per phase of the forward pass, collected only when asked (`moetier bench --profile`):
// where a decode step's time goes, to set against the bytes it reads. Off, it costs one null
// check per phase.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>

namespace moetier {

enum class Phase : size_t {
  kAttnQkv,        // q/k/v projections (one pool job)
  kAttention,      // RoPE, cache append, causal attention
  kAttnOut,        // o_proj
  kRouter,         // router logits
  kRouting,        // softmax, top-k, grouping by expert, activation preparation (caller)
  kExpertsGateUp,  // job A: gate, up, silu
  kExpertsDown,    // job B: down, weighted sum
  kLmHead,         // final norm and lm_head
  // A GPU backend's host side (its kernels are asynchronous: the phases above then time only
  // their launches):
  kGpuWait,     // waiting for the GPU (a layer's routing read back before its experts; with
                // hybrid's worker, the GPU itself waits there for the previous layer's CPU share)
  kCpuExperts,  // the CPU executor's experts on the host thread (offload's CPU layers; hybrid
                // without its worker)
  // Concurrent with the host's phases: device time (CUDA events), and hybrid's worker thread.
  kGpuExperts,  // the GPU's expert kernels (gate+up and down launches of every MoE layer)
  kCopies,      // the copy engine's expert copies (offload and hybrid misses, streamed banks)
  kCpuShare,    // hybrid: the worker computing the CPU's share of misses
  kForward,     // the whole Forward call
  kCount
};

inline constexpr std::array<const char*, static_cast<size_t>(Phase::kCount)> kPhaseNames = {
    "attn_qkv",        "attention",    "attn_out",  "router",   "routing",
    "experts_gate_up", "experts_down", "lm_head",   "gpu_wait", "cpu_experts",
    "gpu_experts",     "copies",       "cpu_share", "forward"};

// Whether `p` runs beside the host thread (its time is not part of the Forward's wall time).
constexpr bool IsConcurrentPhase(Phase p) {
  return p == Phase::kGpuExperts || p == Phase::kCopies || p == Phase::kCpuShare;
}

struct PhaseTimes {
  std::array<double, static_cast<size_t>(Phase::kCount)> seconds{};
  double& operator[](Phase p) { return seconds[static_cast<size_t>(p)]; }
  double operator[](Phase p) const { return seconds[static_cast<size_t>(p)]; }
};

// Adds the time between construction and destruction to (*times)[phase]; nothing when null.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes* times, Phase phase) : times_(times), phase_(phase) {
    if (times_ != nullptr) t0_ = std::chrono::steady_clock::now();
  }
  ~ScopedPhase() { Switch(phase_); }
  // Charges the time so far to the current phase and times `next` from now.
  void Switch(Phase next) {
    if (times_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    (*times_)[phase_] += std::chrono::duration<double>(now - t0_).count();
    phase_ = next;
    t0_ = now;
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimes* times_;
  Phase phase_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace moetier
