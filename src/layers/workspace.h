// Scratch buffers for one forward pass, reused across layers and steps: after the first step of
// a given size nothing is allocated. Owned by the model; used by the engine thread only.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "core/phase_times.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"

namespace moetier {

enum class Scratch : size_t {
  kQ,             // [T, n_heads * head_dim]
  kK,             // [T, n_kv_heads * head_dim]
  kV,             // [T, n_kv_heads * head_dim]
  kAttnOut,       // [T, n_heads * head_dim]
  kRouter,        // [T, n_experts]
  kAssignWeight,  // [T * top_k] routing weight per expert-sorted assignment
  kGate,          // [T, width]
  kUp,            // [T, width]
  kExpertOut,     // [T * top_k, d_model] each assignment's expert output
  kRouteWeight,   // [T, top_k]
  kRope,          // [T, head_dim] RoPE cos/sin rows (Rope::Angles)
  kCount
};

class Workspace {
 public:
  explicit Workspace(ThreadPool& pool) : pool_(pool) {}
  ThreadPool& pool() { return pool_; }
  // A buffer of at least n floats; contents are unspecified.
  float* Get(Scratch slot, size_t n) {
    auto& b = buffers_[static_cast<size_t>(slot)];
    if (b.size() < n) b.resize(n);
    return b.data();
  }
  std::vector<int32_t>& ints(size_t i) { return ints_[i]; }
  // Per-phase timing, or null (off).
  PhaseTimes* times() const { return times_; }
  void set_times(PhaseTimes* t) { times_ = t; }
  // Activations prepared for the kernels, by use: storage grows to the largest request and is
  // kept, so steady-state steps do not allocate.
  std::vector<kernels::PreparedActivations>& prepared(size_t i) { return prepared_[i]; }

 private:
  ThreadPool& pool_;
  PhaseTimes* times_ = nullptr;
  std::array<std::vector<float>, static_cast<size_t>(Scratch::kCount)> buffers_;
  std::array<std::vector<int32_t>, 8> ints_;
  std::array<std::vector<kernels::PreparedActivations>, 2> prepared_;
};

}  // namespace moetier
