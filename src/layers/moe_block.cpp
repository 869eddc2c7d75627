#include "layers/moe_block.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"

namespace moetier {

namespace {
// Up to this many assignments (tokens x top_k) the down projection's activations are prepared
// on the calling thread: a decode step's 8 rows take ~2 µs, less than a pool job's hand-off.
constexpr size_t kSerialPrepareRows = 64;
// Up to this many assignments the down projection runs expert-major (see MoeBlock, B'): its
// routed sum then takes a serial pass of n_assign x d_model multiply-adds (16 x 2048: ~5 µs).
constexpr size_t kExpertMajorDownMaxAssignments = 16;
}  // namespace

void SelectTopK(const float* probs, int64_t n_tokens, const RouterOptions& opts, int32_t* ids,
                float* weights) {
  const int64_t E = opts.n_experts;
  const int64_t K = opts.top_k;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* p = probs + t * E;
    int32_t* id = ids + t * K;
    float* wt = weights + t * K;
    // Insertion into a sorted list of K: top_k is small (≤ 16 in real models).
    int64_t filled = 0;
    for (int32_t e = 0; e < E; ++e) {
      int64_t pos = filled;
      while (pos > 0 && p[e] > wt[pos - 1]) --pos;  // strict: ties keep the lower id first
      if (pos >= K) continue;
      const int64_t last = std::min(filled, K - 1);
      for (int64_t j = last; j > pos; --j) {
        wt[j] = wt[j - 1];
        id[j] = id[j - 1];
      }
      wt[pos] = p[e];
      id[pos] = e;
      if (filled < K) ++filled;
    }
    if (opts.normalize_top_k) {
      double sum = 0.0;
      for (int64_t j = 0; j < K; ++j) sum += wt[j];
      for (int64_t j = 0; j < K; ++j) wt[j] = static_cast<float>(wt[j] / sum);
    }
  }
}

// The executor for one MoE layer (DESIGN.md "CPU executor"). Three pool jobs whatever the
// number of tokens and experts, each cut into tasks that read distinct weight bytes:
//   A. gate and up rows of every chosen expert, (expert, row block) tasks, each finishing its
//      rows with silu(gate) * up, so the hidden activations never take a separate pass;
//   B. down rows, (output row block) tasks, each running every chosen expert's rows of that
//      block and adding them into `out` with the routing weights, experts in ascending id
//      order: no two tasks write the same element, so no locks and no reduction pass;
//   B'. for a decode step's few assignments instead (expert, row block) tasks, each one long run
//      of an expert's down rows, then the same routed sum on the calling thread.
// Tokens are grouped by expert, so with many tokens (prefill) every chosen expert's bytes are
// read once per call. Activations are prepared (quantized for q8_0/q4_0 weights) once for all
// tokens, then gathered per expert. Every element's arithmetic is fixed by its token, expert
// and row, never by the task split or thread count: results are bit-identical across both.
void MoeBlock(Workspace& ws, const TensorView& router, const RouterOptions& opts,
              const ExpertSource& experts, int64_t layer, const float* x, int64_t n_tokens,
              int64_t d_model, float* out, float* router_logits_out) {
  const int64_t E = opts.n_experts;
  const int64_t K = opts.top_k;
  const size_t T = static_cast<size_t>(n_tokens);
  ThreadPool& pool = ws.pool();
  float* probs = ws.Get(Scratch::kRouter, T * static_cast<size_t>(E));
  ScopedPhase phase(ws.times(), Phase::kRouter);
  kernels::MatMul(pool, x, n_tokens, router, probs);
  phase.Switch(Phase::kRouting);
  if (router_logits_out != nullptr)
    std::memcpy(router_logits_out, probs, T * static_cast<size_t>(E) * sizeof(float));
  for (int64_t t = 0; t < n_tokens; ++t) kernels::SoftmaxRow(probs + t * E, E);

  const size_t n_assign = T * static_cast<size_t>(K);
  std::vector<int32_t>& ids = ws.ints(0);
  ids.resize(n_assign);
  float* route_weight = ws.Get(Scratch::kRouteWeight, n_assign);
  SelectTopK(probs, n_tokens, opts, ids.data(), route_weight);

  // Counting sort of the assignments by expert: assignment j (expert-sorted) is token
  // tokens_of[j] with routing weight weight_of[j]; expert e owns [start[e], start[e+1]).
  std::vector<int32_t>& tokens_of = ws.ints(1);
  std::vector<int32_t>& start = ws.ints(2);
  std::vector<int32_t>& fill = ws.ints(3);
  std::vector<int32_t>& active = ws.ints(4);  // chosen experts, ascending
  tokens_of.resize(n_assign);
  start.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ids) ++start[static_cast<size_t>(e) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  fill.assign(start.begin(), start.end() - 1);
  float* weight_of = ws.Get(Scratch::kAssignWeight, n_assign);
  for (size_t i = 0; i < n_assign; ++i) {
    const int32_t pos = fill[static_cast<size_t>(ids[i])]++;
    tokens_of[static_cast<size_t>(pos)] = static_cast<int32_t>(i / static_cast<size_t>(K));
    weight_of[static_cast<size_t>(pos)] = route_weight[i];
  }
  active.clear();
  for (int32_t e = 0; e < E; ++e)
    if (start[static_cast<size_t>(e) + 1] > start[static_cast<size_t>(e)]) active.push_back(e);
  const size_t n_active = active.size();
  auto expert_of = [&](size_t a) -> const ExpertWeights& {
    return experts.Expert(layer, active[a]);
  };
  auto first_of = [&](size_t a) {
    return static_cast<int64_t>(start[static_cast<size_t>(active[a])]);
  };
  auto count_of = [&](size_t a) {
    return static_cast<int64_t>(start[static_cast<size_t>(active[a]) + 1]) - first_of(a);
  };

  const ExpertWeights& e0 = expert_of(0);
  const int64_t W = e0.gate.shape.front();
  const DType up_dtype = e0.gate.dtype;
  const DType down_dtype = e0.down.dtype;

  // Activations for gate/up: prepared once for every token, then gathered per expert.
  std::vector<kernels::PreparedActivations>& x_prep = ws.prepared(0);
  std::vector<kernels::PreparedActivations>& h_prep = ws.prepared(1);
  if (x_prep.size() < n_active + 1) x_prep.resize(static_cast<size_t>(E) + 1);
  if (h_prep.size() < n_active) h_prep.resize(static_cast<size_t>(E));
  kernels::PreparedActivations& x_all = x_prep[0];
  // With several tokens x_all is only the source of the per-expert Gathers: no tile copy.
  x_all.Prepare(pool, x, n_tokens, d_model, up_dtype, kernels::ActiveCpuIsa(),
                n_tokens > 1 ? kernels::PreparedActivations::Tiles::kNone
                             : kernels::PreparedActivations::Tiles::kIfUseful);
  if (n_tokens > 1) {
    pool.ParallelTasks(n_active, [&](size_t a, int) {
      x_prep[a + 1].Gather(x_all, tokens_of.data() + first_of(a), count_of(a));
    });
  }
  auto x_for = [&](size_t a) -> const kernels::PreparedActivations& {
    return n_tokens > 1 ? x_prep[a + 1] : x_all;
  };

  // A: hidden[j, :] = silu(gate · x_j) * (up · x_j) for every assignment j.
  phase.Switch(Phase::kExpertsGateUp);
  float* hidden = ws.Get(Scratch::kGate, n_assign * static_cast<size_t>(W));
  float* up = ws.Get(Scratch::kUp, n_assign * static_cast<size_t>(W));
  const int64_t tokens_per_expert = static_cast<int64_t>(n_assign / n_active);
  const int64_t rows_a = kernels::RowsPerTask(
      W * static_cast<int64_t>(n_active),
      2 * static_cast<int64_t>(DTypeRowBytes(up_dtype, d_model)), tokens_per_expert, pool.size());
  const int64_t blocks_a = (W + rows_a - 1) / rows_a;
  pool.ParallelTasks(n_active * static_cast<size_t>(blocks_a), [&](size_t task, int) {
    const size_t a = task / static_cast<size_t>(blocks_a);
    const int64_t r0 = static_cast<int64_t>(task % static_cast<size_t>(blocks_a)) * rows_a;
    const int64_t r1 = std::min(W, r0 + rows_a);
    const ExpertWeights& w = expert_of(a);
    const int64_t j0 = first_of(a), m = count_of(a);
    kernels::DotRows(w.gate, r0, r1, x_for(a), hidden + j0 * W, W);
    kernels::DotRows(w.up, r0, r1, x_for(a), up + j0 * W, W);
    for (int64_t j = j0; j < j0 + m; ++j)
      kernels::SiluMul(hidden + j * W + r0, up + j * W + r0, r1 - r0);
  });

  phase.Switch(Phase::kRouting);
  // The down projection's activations: one expert's hidden rows each (in place for float
  // formats; quantized for q8_0/q4_0, on the pool when there are many).
  auto prepare_down = [&](size_t a, int) {
    h_prep[a].Prepare(hidden + first_of(a) * W, count_of(a), W, down_dtype);
  };
  if (n_assign > kSerialPrepareRows) {
    pool.ParallelTasks(n_active, prepare_down);
  } else {
    for (size_t a = 0; a < n_active; ++a) prepare_down(a, 0);
  }

  // B: out[t, r] = Σ over t's experts, ascending: weight · (down_e · hidden_j)[r].
  phase.Switch(Phase::kExpertsDown);
  float* y = ws.Get(Scratch::kExpertOut, n_assign * static_cast<size_t>(d_model));
  if (n_assign <= kExpertMajorDownMaxAssignments) {
    // B' (decode): (expert, row block) tasks, each one contiguous run of an expert's down rows,
    // then the routed sum on this thread. Row-block tasks (below) would read every chosen
    // expert's rows of their block, a run of only rows x 432 bytes each (q4_0, width 768: 8.6 KB
    // at 16 threads), and every run starts with its first prefetch distance unfetched: the down
    // projection streamed 22-27 GB/s that way against 29-38 for the gate and up rows (dev VM,
    // q4_0, 2 threads). Each element gets the same products and Axpy order either way.
    const int64_t rows = kernels::RowsPerTask(d_model * static_cast<int64_t>(n_active),
                                              static_cast<int64_t>(DTypeRowBytes(down_dtype, W)),
                                              tokens_per_expert, pool.size());
    const int64_t blocks = (d_model + rows - 1) / rows;
    pool.ParallelTasks(n_active * static_cast<size_t>(blocks), [&](size_t task, int) {
      const size_t a = task / static_cast<size_t>(blocks);
      const int64_t r0 = static_cast<int64_t>(task % static_cast<size_t>(blocks)) * rows;
      kernels::DotRows(expert_of(a).down, r0, std::min(d_model, r0 + rows), h_prep[a],
                       y + first_of(a) * d_model, d_model);
    });
    std::memset(out, 0, T * static_cast<size_t>(d_model) * sizeof(float));
    for (size_t a = 0; a < n_active; ++a)
      for (int64_t j = first_of(a); j < first_of(a) + count_of(a); ++j)
        kernels::Axpy(weight_of[j], y + j * d_model, d_model,
                      out + tokens_of[static_cast<size_t>(j)] * d_model);
    return;
  }
  const int64_t rows_b =
      kernels::RowsPerTask(d_model, static_cast<int64_t>(n_active * DTypeRowBytes(down_dtype, W)),
                           tokens_per_expert, pool.size());
  const int64_t blocks_b = (d_model + rows_b - 1) / rows_b;
  pool.ParallelTasks(static_cast<size_t>(blocks_b), [&](size_t task, int) {
    const int64_t r0 = static_cast<int64_t>(task) * rows_b;
    const int64_t r1 = std::min(d_model, r0 + rows_b);
    for (int64_t t = 0; t < n_tokens; ++t)
      std::memset(out + t * d_model + r0, 0, static_cast<size_t>(r1 - r0) * sizeof(float));
    for (size_t a = 0; a < n_active; ++a) {
      const int64_t j0 = first_of(a), m = count_of(a);
      kernels::DotRows(expert_of(a).down, r0, r1, h_prep[a], y + j0 * d_model, d_model);
      for (int64_t j = j0; j < j0 + m; ++j)
        kernels::Axpy(weight_of[j], y + j * d_model + r0, r1 - r0,
                      out + tokens_of[static_cast<size_t>(j)] * d_model + r0);
    }
  });
}

}  // namespace moetier
