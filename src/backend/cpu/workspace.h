// The CPU backend's scratch, reused across layers and steps: after the first step of a given
// size nothing is allocated. Used by the engine thread only.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "core/phase_times.h"
#include "core/thread_pool.h"

namespace moetier {

enum class Scratch : size_t {
  kRouter,       // [T, n_experts] router logits, then probabilities
  kRouteWeight,  // [T, top_k]
  kRope,         // [T, head_dim] RoPE cos/sin rows (Rope::Angles)
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

 private:
  ThreadPool& pool_;
  PhaseTimes* times_ = nullptr;
  std::array<std::vector<float>, static_cast<size_t>(Scratch::kCount)> buffers_;
  std::array<std::vector<int32_t>, 3> ints_;
};

}  // namespace moetier
