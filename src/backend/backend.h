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
// next call that reads them runs (a GPU backend may queue work on one stream and synchronize
// where results reach the host: Route, FirstNonFinite, and the logits).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/batch.h"
#include "backend/kv_cache.h"
#include "backend/rope.h"
#include "core/phase_times.h"
#include "core/tensor.h"
#include "experts/expert_executor.h"
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

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

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

  // The router: logits, softmax, top-k, and the batch's tokens grouped by expert in `routing`
  // (host memory: what the expert executor schedules from). router_logits, when not null,
  // receives the raw logits [n_tokens, n_experts] (tests against a reference).
  virtual void Route(const TensorView& router, const RouterOptions& opts, const float* x,
                     int64_t n_tokens, Routing& routing, float* router_logits) = 0;
  // Where this backend runs routed experts.
  virtual ExpertExecutor& Experts() = 0;

  // The index of the first NaN or infinity of x[0, n), or -1.
  virtual int64_t FirstNonFinite(const float* x, int64_t n) = 0;

  // Per-phase timing (bench --profile), or null.
  virtual void SetPhaseTimes(PhaseTimes* times) = 0;
  virtual PhaseTimes* phase_times() const = 0;
};

}  // namespace moetier
