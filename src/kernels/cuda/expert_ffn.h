// The routed experts of one MoE layer on the GPU, over a step's device routing (routing.h):
//   h[j, :]   = silu(gate_e · x[token_of[j]]) ⊙ (up_e · x[token_of[j]])   for every assignment j
//               of every active expert e                                   (gate+up launch)
//   out[t, :] = Σ over token t's assignments j, experts ascending, of
//               weight_of[j] · down_e · h[j]               (down launch, then the routed sum)
// Weights bf16, Q8_0 or Q4_0 (activations quantized to 8 bits per 32-block for the quantized
// formats, as the CPU executor does: experts/cpu_executor.h), fp32 accumulation. Where an
// expert's bytes are (VRAM-resident layer, a slot of the expert cache) is the pointer table's
// business: the kernels read each active expert's matrices through table[expert id].
//
// Decode (few tokens per expert) runs one launch over all active experts for gate+up+SwiGLU
// and one for down, each weight row read once per 8 of the expert's tokens (steps of a few
// tokens: a warp per output row, the same arithmetic, and Run's down launch adds the routed sum
// itself); many tokens per
// expert (prefill) run tensor-core grouped GEMMs (bf16 operands for bf16 weights; for Q8_0/Q4_0
// the decode path's 8-bit activations on int8 MMAs, the same integer block dots) — chosen
// inside Run by the step's tokens per expert (ExpertFfnOptions can force either). The routed sum
// adds in a fixed order (no atomics): a token's output does not depend on which other tokens share
// the step (within one path: kAuto picks the path by the step's size), nor on which memory an
// expert's bytes came from.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/routing.h"

namespace moetier::cuda {

// One expert's three matrices, device addresses: gate and up [width, d_model], down
// [d_model, width], each in the layer's dtype (rows of GGUF blocks for Q8_0/Q4_0).
struct ExpertPointers {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
};

struct ExpertShape {
  DType dtype = DType::kBF16;  // kBF16, kQ8_0 or kQ4_0
  int64_t d_model = 0;
  int64_t width = 0;  // the expert's intermediate size
};

// Which kernels Run uses. kAuto picks by the step's tokens per expert (n_tokens * top_k /
// n_experts): decode kernels (CUDA cores, each weight byte read once per 8 tokens) for few,
// tensor-core grouped GEMMs for many. The others force one path (tests, crossover benches).
enum class ExpertFfnPath { kAuto, kDecode, kPrefill };

struct ExpertFfnOptions {
  ExpertFfnPath path = ExpertFfnPath::kAuto;
};

// Scratch for a layer's step of up to max_tokens tokens with top_k experts each: h
// [max_tokens * top_k, width], the per-assignment down outputs, quantized activations.
// Shapes: d_model and width even for bf16, multiples of 32 for Q8_0/Q4_0 (whole blocks).
// Device addresses (weights, x, out) need only their type's natural alignment; 16-byte aligned
// rows take the fast loads.
class ExpertFfn {
 public:
  static Expected<ExpertFfn> Create(const ExpertShape& shape, int64_t max_tokens, int64_t top_k,
                                    const ExpertFfnOptions& options = {});
  ExpertFfn();
  ~ExpertFfn();
  ExpertFfn(ExpertFfn&&) noexcept;
  ExpertFfn& operator=(ExpertFfn&&) noexcept;

  // out [r.n_tokens, d_model] (overwritten) for x [r.n_tokens, d_model]; table: device array
  // [r.n_experts] of ExpertPointers (entries of inactive experts are not read). Queues the
  // gate+up and down launches on `stream`; r.n_tokens <= max_tokens, r.n_experts <= 65535.
  // Create sizes the decode grids for the device current then; Run on that device.
  // *r.n_active is also copied to *active_record when that is not null (see RoutedSum).
  // x8: x already quantized (Q8_0/Q4_0 experts; rows of d_model, as CudaBackend's norms write
  // them), read by the decode kernels instead of quantizing x in a launch of their own.
  void Run(const DeviceRouting& r, const ExpertPointers* table, const float* x, float* out,
           cudaStream_t stream, int32_t* active_record = nullptr,
           const QuantizedActs* x8 = nullptr);
  // Run in two halves, for a caller that adds a partial sum computed elsewhere (the hybrid
  // split: the CPU executor's experts) between them. RunExperts queues the gate+up and down
  // launches (per-assignment outputs in the scratch); RoutedSum then writes
  // out[t, :] = (Σ over t's assignments, experts ascending, of weight · y) + partial[t, :]
  // (partial: device [r.n_tokens, d_model], or null for none). Run is the two with no partial.
  // RoutedSum also copies *r.n_active to *active_record when that is not null (a caller's
  // per-layer counts of active experts, without a copy of their own).
  void RunExperts(const DeviceRouting& r, const ExpertPointers* table, const float* x,
                  cudaStream_t stream, const QuantizedActs* x8 = nullptr);
  void RoutedSum(const DeviceRouting& r, const float* partial, float* out, cudaStream_t stream,
                 int32_t* active_record = nullptr);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace moetier::cuda
