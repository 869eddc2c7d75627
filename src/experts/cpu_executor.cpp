#include "experts/cpu_executor.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/elementwise.h"

namespace moetier {

namespace {
// Up to this many assignments (tokens x top_k) the down projection's activations are prepared
// on the calling thread: a decode step's 8 rows take ~2 µs, less than a pool job's hand-off.
constexpr size_t kSerialPrepareRows = 64;
// The down projection runs expert-major (B') while experts have at most this many tokens each
// on average: decode steps, of one sequence or of many (a step of 16 sequences gives ~1.6 tokens
// to each of ~80 of 128 experts). Row-block tasks (B) would read every chosen expert's rows of
// their block, each a short run of rows; with more tokens per expert their compute hides that.
constexpr double kExpertMajorDownMaxTokensPerExpert = 2.0;
// Up to this many assignments the routed sum after B' runs on the calling thread (16 x 2048
// multiply-adds: ~5 µs, less than a pool job's hand-off); more are summed on the pool.
constexpr size_t kSerialRoutedSumAssignments = 16;

template <typename T>
T* Fit(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
}  // namespace

CpuExpertExecutor::CpuExpertExecutor(const ExpertSource& experts, ThreadPool& pool, int64_t d_model)
    : experts_(experts), pool_(pool), d_model_(d_model) {}

void CpuExpertExecutor::Run(int64_t layer, const Routing& r, const float* x, float* out) {
  const ExpertWeights& e0 = experts_.CpuExpert(layer, r.experts.front());
  const int64_t width = e0.gate.shape.front();
  ScopedPhase phase(times_, Phase::kRouting);
  PrepareInputs(r, x, e0.gate.dtype);
  phase.Switch(Phase::kExpertsGateUp);
  GateUp(layer, r, width, e0.gate.dtype);
  phase.Switch(Phase::kRouting);
  PrepareHidden(r, width, e0.down.dtype);
  phase.Switch(Phase::kExpertsDown);
  const double tokens_per_expert =
      static_cast<double>(r.n_assignments()) / static_cast<double>(r.n_active());
  if (tokens_per_expert <= kExpertMajorDownMaxTokensPerExpert)
    DownExpertMajor(layer, r, width, e0.down.dtype, out);
  else
    DownRowMajor(layer, r, width, e0.down.dtype, out);
}

// Activations for gate/up: prepared once for every token, then gathered per expert.
void CpuExpertExecutor::PrepareInputs(const Routing& r, const float* x, DType up_dtype) {
  const size_t n_active = r.n_active();
  if (x_prep_.size() < n_active + 1) x_prep_.resize(n_active + 1);
  kernels::PreparedActivations& x_all = x_prep_[0];
  // With several tokens x_all is only the source of the per-expert Gathers: no tile copy.
  x_all.Prepare(pool_, x, r.n_tokens, d_model_, up_dtype, kernels::ActiveCpuIsa(),
                r.n_tokens > 1 ? kernels::PreparedActivations::Tiles::kNone
                               : kernels::PreparedActivations::Tiles::kIfUseful);
  if (r.n_tokens > 1)
    pool_.ParallelTasks(n_active, [&](size_t a, int) {
      x_prep_[a + 1].Gather(x_all, r.token_of.data() + r.first(a), r.count(a));
    });
}

// A: hidden[j, :] = silu(gate · x_j) * (up · x_j) for every assignment j.
void CpuExpertExecutor::GateUp(int64_t layer, const Routing& r, int64_t width, DType up_dtype) {
  const size_t n_active = r.n_active(), n_assign = r.n_assignments();
  float* hidden = Fit(hidden_, n_assign * static_cast<size_t>(width));
  float* up = Fit(up_, n_assign * static_cast<size_t>(width));
  const int64_t tokens_per_expert = static_cast<int64_t>(n_assign / n_active);
  const int64_t rows = kernels::RowsPerTask(
      width * static_cast<int64_t>(n_active),
      2 * static_cast<int64_t>(DTypeRowBytes(up_dtype, d_model_)), tokens_per_expert, pool_.size());
  const int64_t blocks = (width + rows - 1) / rows;
  pool_.ParallelTasks(n_active * static_cast<size_t>(blocks), [&](size_t task, int) {
    const size_t a = task / static_cast<size_t>(blocks);
    const int64_t r0 = static_cast<int64_t>(task % static_cast<size_t>(blocks)) * rows;
    const int64_t r1 = std::min(width, r0 + rows);
    const ExpertWeights& w = experts_.CpuExpert(layer, r.experts[a]);
    const int64_t j0 = r.first(a), m = r.count(a);
    kernels::DotRows(w.gate, r0, r1, InputOf(r, a), hidden + j0 * width, width);
    kernels::DotRows(w.up, r0, r1, InputOf(r, a), up + j0 * width, width);
    for (int64_t j = j0; j < j0 + m; ++j)
      kernels::SiluMul(hidden + j * width + r0, up + j * width + r0, r1 - r0);
  });
}

// The down projection's activations: one expert's hidden rows each (in place for float
// formats; quantized for q8_0/q4_0, on the pool when there are many).
void CpuExpertExecutor::PrepareHidden(const Routing& r, int64_t width, DType down_dtype) {
  const size_t n_active = r.n_active();
  if (h_prep_.size() < n_active) h_prep_.resize(n_active);
  auto prepare = [&](size_t a, int) {
    h_prep_[a].Prepare(hidden_.data() + r.first(a) * width, r.count(a), width, down_dtype);
  };
  if (r.n_assignments() > kSerialPrepareRows) {
    pool_.ParallelTasks(n_active, prepare);
  } else {
    for (size_t a = 0; a < n_active; ++a) prepare(a, 0);
  }
}

// B' (decode): (expert, row block) tasks, each one contiguous run of an expert's down rows, then
// the routed sum on this thread. Row-block tasks (B) would read every chosen expert's rows of
// their block, a short run each, and every run starts with its first prefetch distance unfetched:
// on the dev VM the down projection streamed well below the gate and up rows that way (q4_0, 2
// threads; docs/benchmarks.md). Each element gets the same products and Axpy order either way.
void CpuExpertExecutor::DownExpertMajor(int64_t layer, const Routing& r, int64_t width,
                                        DType down_dtype, float* out) {
  const size_t n_active = r.n_active(), n_assign = r.n_assignments();
  float* y = Fit(y_, n_assign * static_cast<size_t>(d_model_));
  const int64_t tokens_per_expert = static_cast<int64_t>(n_assign / n_active);
  const int64_t rows = kernels::RowsPerTask(d_model_ * static_cast<int64_t>(n_active),
                                            static_cast<int64_t>(DTypeRowBytes(down_dtype, width)),
                                            tokens_per_expert, pool_.size());
  const int64_t blocks = (d_model_ + rows - 1) / rows;
  pool_.ParallelTasks(n_active * static_cast<size_t>(blocks), [&](size_t task, int) {
    const size_t a = task / static_cast<size_t>(blocks);
    const int64_t r0 = static_cast<int64_t>(task % static_cast<size_t>(blocks)) * rows;
    kernels::DotRows(experts_.CpuExpert(layer, r.experts[a]).down, r0,
                     std::min(d_model_, r0 + rows), h_prep_[a], y + r.first(a) * d_model_,
                     d_model_);
  });
  RoutedSum(r, y, out);
}

// out[t, :] = Σ over t's assignments j, experts ascending, of weight_j · y[j, :]; by row blocks
// on the pool when there are many assignments. Every element adds the same products in the same
// order either way.
void CpuExpertExecutor::RoutedSum(const Routing& r, const float* y, float* out) {
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < r.n_tokens; ++t)
      std::memset(out + t * d_model_ + r0, 0, static_cast<size_t>(r1 - r0) * sizeof(float));
    for (size_t a = 0; a < r.n_active(); ++a)
      for (int64_t j = r.first(a); j < r.first(a) + r.count(a); ++j)
        kernels::Axpy(r.weight_of[static_cast<size_t>(j)], y + j * d_model_ + r0, r1 - r0,
                      out + r.token_of[static_cast<size_t>(j)] * d_model_ + r0);
  };
  if (r.n_assignments() <= kSerialRoutedSumAssignments) return rows(0, d_model_);
  const int64_t block = std::max<int64_t>(64, d_model_ / (4 * pool_.size()));
  const int64_t n_blocks = (d_model_ + block - 1) / block;
  pool_.ParallelTasks(static_cast<size_t>(n_blocks), [&](size_t task, int) {
    const int64_t r0 = static_cast<int64_t>(task) * block;
    rows(r0, std::min(d_model_, r0 + block));
  });
}

// B: out[t, rows] = Σ over t's experts, ascending: weight · (down_e · hidden_j)[rows].
void CpuExpertExecutor::DownRowMajor(int64_t layer, const Routing& r, int64_t width,
                                     DType down_dtype, float* out) {
  const size_t n_active = r.n_active(), n_assign = r.n_assignments();
  float* y = Fit(y_, n_assign * static_cast<size_t>(d_model_));
  const int64_t tokens_per_expert = static_cast<int64_t>(n_assign / n_active);
  const int64_t rows = kernels::RowsPerTask(
      d_model_, static_cast<int64_t>(n_active * DTypeRowBytes(down_dtype, width)),
      tokens_per_expert, pool_.size());
  const int64_t blocks = (d_model_ + rows - 1) / rows;
  pool_.ParallelTasks(static_cast<size_t>(blocks), [&](size_t task, int) {
    const int64_t r0 = static_cast<int64_t>(task) * rows;
    const int64_t r1 = std::min(d_model_, r0 + rows);
    for (int64_t t = 0; t < r.n_tokens; ++t)
      std::memset(out + t * d_model_ + r0, 0, static_cast<size_t>(r1 - r0) * sizeof(float));
    for (size_t a = 0; a < n_active; ++a) {
      const int64_t j0 = r.first(a), m = r.count(a);
      kernels::DotRows(experts_.CpuExpert(layer, r.experts[a]).down, r0, r1, h_prep_[a],
                       y + j0 * d_model_, d_model_);
      for (int64_t j = j0; j < j0 + m; ++j)
        kernels::Axpy(r.weight_of[static_cast<size_t>(j)], y + j * d_model_ + r0, r1 - r0,
                      out + r.token_of[static_cast<size_t>(j)] * d_model_ + r0);
    }
  });
}

}  // namespace moetier
