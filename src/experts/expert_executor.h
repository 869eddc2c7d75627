// ExpertExecutor: runs a routing's experts for one MoE layer — wherever their bytes are and
// wherever they run (the CPU executor, the GPU expert cache, a split between the two). The
// decoder asks only for the weighted sum; the same routing gives the same experts everywhere.
#pragma once

#include <cstdint>

#include "core/phase_times.h"
#include "experts/routing.h"

namespace moetier {

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // out[t, :] = Σ over token t's assignments, in ascending expert order, of
  //             weight · down_e(silu(gate_e · x[t]) ⊙ (up_e · x[t]))
  // for every token of `routing`; x and out: [routing.n_tokens, d_model] (out overwritten).
  virtual void Run(int64_t layer, const Routing& routing, const float* x, float* out) = 0;
  // Per-phase timing (bench --profile), or null.
  virtual void SetPhaseTimes(PhaseTimes* times) = 0;
};

}  // namespace moetier
