// The router's softmax + top-k (one warp per token) and the counting sort of a step's
// assignments by expert (one block; for a decode step of at most 32 assignments, one warp), on
// the device: experts/routing.cpp's SelectTopK and Routing::Group, result for result.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/router.h"

namespace moetier::cuda {
namespace {

// ---- top-k ---------------------------------------------------------------------------------

// A warp keeps a token's probabilities in registers, kMaxPerLane per lane.
constexpr int kMaxPerLane = kMaxRouterExperts / kWarp;
constexpr int64_t kMaxTopKExperts = kMaxRouterExperts;
constexpr int kMaxTopK = kMaxRouterTopK;
constexpr int kTopKWarpsPerBlock = 8;  // tokens per block
// LaunchRoute's one block takes up to this many tokens a warp (at most 32 warps); more go to
// the two kernels, whose top-k spreads over many blocks.
constexpr int64_t kMaxFusedRouteTokensPerWarp = 2;

// Below every probability: marks a lane's slot that is empty or already chosen.
constexpr float kTaken = -1.0f;
// A NaN probability (NaN router logits: a broken model, reported after the step by the
// non-finite scans) ranks below every real one but above kTaken, so every chosen id stays a
// valid expert and the grouping that indexes by it stays in bounds.
constexpr float kNanRank = -0.5f;

// A float's bits in an order that compares as unsigned as the floats do (no NaN), and back.
__device__ __forceinline__ uint32_t OrderedBits(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float FromOrderedBits(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) != 0 ? o & 0x7fffffffu : ~o);
}

// A token's j-th choice, held by lane j < top_k of the warp that chose it.
struct LaneChoice {
  int32_t id = 0;
  float weight = 0.0f;
};

// Token t's top-k by one warp, kPerLane probabilities a lane (n_experts <= kPerLane * 32).
template <int kPerLane>
__device__ LaneChoice TopKLanes(const float* logits, int64_t t, int n_experts, int top_k,
                                bool normalize) {
  const int lane = threadIdx.x % kWarp;
  const float* row = logits + t * n_experts;

  // softmax as kernels::SoftmaxRow: e^(x - max), the sum in double, one reciprocal.
  float p[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < n_experts ? row[e] : -INFINITY;
    m = fmaxf(m, p[i]);
  }
  m = WarpMax(m);
  double sum = 0.0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < n_experts ? expf(p[i] - m) : 0.0f;
    sum += p[i];
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    p[i] = e < n_experts ? (isnan(p[i] * inv) ? kNanRank : p[i] * inv) : kTaken;
  }

  // top_k rounds of a warp arg-max; every lane learns each winner.
  float chosen_p[kMaxTopK];
  int chosen_id[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    chosen_p[j] = 0.0f;
    chosen_id[j] = 0;
    if (j >= top_k) continue;
    float best = kTaken;
    int best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {  // ids ascend with i: strict > keeps the lower
      if (p[i] > best) {
        best = p[i];
        best_id = lane + i * kWarp;
      }
    }
    // The warp's highest probability, then the lowest id that holds it (on equal probability
    // the lower id ranks first): two warp reductions, not a shuffle tree of pairs.
    const uint32_t top = __reduce_max_sync(0xffffffffu, OrderedBits(best));
    best_id = static_cast<int>(__reduce_min_sync(
        0xffffffffu, OrderedBits(best) == top ? static_cast<uint32_t>(best_id) : UINT32_MAX));
    best = FromOrderedBits(top);
    chosen_p[j] = best;
    chosen_id[j] = best_id;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (best_id == lane + i * kWarp) p[i] = kTaken;
  }

  // As SelectTopK: the sum in double, in rank order; each weight divided in double.
  double chosen_sum = 0.0;
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j)
    if (j < top_k) chosen_sum += chosen_p[j];
  LaneChoice mine;
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) {
    if (j < top_k && lane == j) {
      mine.id = chosen_id[j];
      mine.weight = normalize ? static_cast<float>(chosen_p[j] / chosen_sum) : chosen_p[j];
    }
  }
  return mine;
}

// Token t's top-k into ids and weights [t, :top_k].
template <int kPerLane>
__device__ void TopKToken(const float* logits, int64_t t, int n_experts, int top_k, bool normalize,
                          int32_t* ids, float* weights) {
  const LaneChoice c = TopKLanes<kPerLane>(logits, t, n_experts, top_k, normalize);
  const int lane = threadIdx.x % kWarp;
  if (lane < top_k) {
    ids[t * top_k + lane] = c.id;
    weights[t * top_k + lane] = c.weight;
  }
}

// Calls f.template operator()<kPerLane>() with the fewest probabilities a lane that hold
// n_experts (<= kMaxRouterExperts): 4 for 128 experts.
template <typename F>
void ByExpertsPerLane(int64_t n_experts, F&& f) {
  if (n_experts <= 4 * kWarp) return f.template operator()<4>();
  if (n_experts <= 8 * kWarp) return f.template operator()<8>();
  return f.template operator()<kMaxPerLane>();
}

template <int kPerLane>
__global__ void TopKKernel(const float* logits, int64_t n_tokens, int n_experts, int top_k,
                           bool normalize, int32_t* ids, float* weights) {
  PdlWait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTopKWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= n_tokens) return;  // whole warps leave together
  TopKToken<kPerLane>(logits, t, n_experts, top_k, normalize, ids, weights);
}

// ---- grouping ------------------------------------------------------------------------------

// One block sorts all assignments. First it counts each expert's assignments (shared atomics) and
// scans the counts into each expert's first slot; then it places the assignments in chunks of
// one per thread, in assignment order: within a warp, lanes of one expert rank themselves with
// __match_any_sync; across the warps of a chunk, a per-(warp, expert) count table is scanned,
// so the sort is stable (tokens ascending within an expert), as Routing::Group's.
//
// Cost: about 4 barriers and a scan of warps x n_experts table entries per chunk of
// 32 x warps assignments; 16k tokens x top_k 8 is 128 chunks of 1024, on the order of 0.1-0.3 ms.
// Decode (a few dozen assignments) is one chunk: a few microseconds, mostly launch latency.
constexpr int kMaxGroupWarps = 32;
// Shared memory the grouping may use without the opt-in attribute.
constexpr int64_t kDefaultSharedBytes = 48 << 10;
// Most shared memory the grouping asks for (opt-in): keeps at least one warp for ~20k experts.
constexpr int64_t kMaxSharedBytes = 200 << 10;

struct GroupLayout {
  int warps = 0;
  int64_t shared_bytes = 0;
};

// Shared: slot[n_experts + 1] int32, active[n_experts + 1] int32, scan scratch[32] int32, then
// chunk_ofs[(warps + 1) x n_experts] uint16 (counts per warp; the last row is the chunk's total).
int64_t GroupSharedBytes(int64_t n_experts, int warps) {
  return (2 * (n_experts + 1) + kWarp) * 4 + (warps + 1) * n_experts * 2;
}

GroupLayout PlanGroup(int64_t n_experts, int64_t n_assign, int64_t min_warps = 0) {
  int64_t useful_warps = (n_assign + kWarp - 1) / kWarp;
  if (useful_warps < min_warps) useful_warps = min_warps;
  int warps = static_cast<int>(useful_warps < kMaxGroupWarps ? useful_warps : kMaxGroupWarps);
  if (warps < 4) warps = 4;  // the scans over experts want a few warps
  while (warps > 1 && GroupSharedBytes(n_experts, warps) > kDefaultSharedBytes) --warps;
  return {warps, GroupSharedBytes(n_experts, warps)};
}

// Exclusive scan in place of data[0, n); data[n] = the total, which every thread gets back.
__device__ int BlockExclusiveScan(int* data, int n, int* scratch /* [32] */) {
  const int tid = threadIdx.x;
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  const int n_warps = blockDim.x / kWarp;
  const int per_thread = (n + blockDim.x - 1) / blockDim.x;
  const int lo = min(n, tid * per_thread);
  const int hi = min(n, lo + per_thread);
  int local = 0;
  for (int i = lo; i < hi; ++i) local += data[i];
  int incl = local;  // inclusive scan of the warp's thread sums
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == kWarp - 1) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < n_warps ? scratch[lane] : 0;
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    if (lane < n_warps) scratch[lane] = w;
  }
  __syncthreads();
  int run = (warp > 0 ? scratch[warp - 1] : 0) + incl - local;
  const int total = scratch[n_warps - 1];
  for (int i = lo; i < hi; ++i) {
    const int v = data[i];
    data[i] = run;
    run += v;
  }
  if (tid == 0) data[n] = total;
  __syncthreads();
  return total;
}

// The grouping by the whole block; `shared_raw` holds GroupSharedBytes(n_experts, warps).
__device__ void GroupAssignments(const int32_t* ids, const float* weights, int n_assign, int top_k,
                                 int n_experts, int32_t* n_active_out, int32_t* experts,
                                 int32_t* begin, int32_t* token_of, float* weight_of,
                                 int32_t* assign_of, int4* shared_raw) {
  int* slot = reinterpret_cast<int*>(shared_raw);                  // [n_experts + 1]
  int* active = slot + n_experts + 1;                              // [n_experts + 1]
  int* scratch = active + n_experts + 1;                           // [32]
  auto* chunk_ofs = reinterpret_cast<uint16_t*>(scratch + kWarp);  // [warps + 1][n_experts]
  const int tid = threadIdx.x;
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  const int n_warps = blockDim.x / kWarp;
  uint16_t* chunk_total = chunk_ofs + n_warps * n_experts;

  // Counting: the counts, their scan (each expert's first slot) and the active experts.
  for (int e = tid; e < n_experts; e += blockDim.x) {
    slot[e] = 0;
    chunk_total[e] = 0;
  }
  __syncthreads();
  for (int i = tid; i < n_assign; i += blockDim.x) atomicAdd(&slot[ids[i]], 1);
  __syncthreads();
  for (int e = tid; e < n_experts; e += blockDim.x) active[e] = slot[e] > 0 ? 1 : 0;
  __syncthreads();
  BlockExclusiveScan(slot, n_experts, scratch);
  const int n_active = BlockExclusiveScan(active, n_experts, scratch);
  for (int e = tid; e < n_experts; e += blockDim.x) {
    if (active[e + 1] > active[e]) {  // e is chosen: its rank among the chosen is active[e]
      experts[active[e]] = e;
      begin[active[e]] = slot[e];
    }
  }
  for (int a = n_active + tid; a <= n_experts; a += blockDim.x) begin[a] = n_assign;
  if (tid == 0) *n_active_out = n_active;

  // Placement: stable, one assignment per thread per chunk.
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int base = 0; base < n_assign; base += blockDim.x) {
    for (int e = tid; e < n_experts; e += blockDim.x) {
      slot[e] += chunk_total[e];  // the previous chunk's assignments are placed
      for (int w = 0; w < n_warps; ++w) chunk_ofs[w * n_experts + e] = 0;
    }
    __syncthreads();
    const int i = base + tid;
    const bool valid = i < n_assign;
    const int e = valid ? ids[i] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank_in_warp = __popc(same & lanes_below);
    if (valid && rank_in_warp == 0) chunk_ofs[warp * n_experts + e] = __popc(same);
    __syncthreads();
    for (int ex = tid; ex < n_experts; ex += blockDim.x) {  // counts -> offsets within the chunk
      int run = 0;
      for (int w = 0; w < n_warps; ++w) {
        const int c = chunk_ofs[w * n_experts + ex];
        chunk_ofs[w * n_experts + ex] = static_cast<uint16_t>(run);
        run += c;
      }
      chunk_total[ex] = static_cast<uint16_t>(run);
    }
    __syncthreads();
    if (valid) {
      const int pos = slot[e] + chunk_ofs[warp * n_experts + e] + rank_in_warp;
      const int t = i / top_k;
      token_of[pos] = t;
      weight_of[pos] = weights[i];
      // This assignment's place among token t's, experts ascending (ties: the earlier first).
      const int j = i - t * top_k;
      int order = 0;
      for (int k = 0; k < top_k; ++k) {
        const int other = ids[t * top_k + k];
        order += other < e || (other == e && k < j) ? 1 : 0;
      }
      assign_of[t * top_k + order] = pos;
    }
    __syncthreads();  // chunk_ofs and slot are reused by the next chunk
  }
}

__global__ void GroupKernel(const int32_t* ids, const float* weights, int n_assign, int top_k,
                            int n_experts, int32_t* n_active_out, int32_t* experts, int32_t* begin,
                            int32_t* token_of, float* weight_of, int32_t* assign_of) {
  PdlWait();
  extern __shared__ int4 shared_raw[];
  GroupAssignments(ids, weights, n_assign, top_k, n_experts, n_active_out, experts, begin, token_of,
                   weight_of, assign_of, shared_raw);
}

// Both in one block, for steps of a few tokens: the warps take the tokens' top-k in turn, then
// the block groups them (its own writes of ids and weights are visible after the barrier).
// Launched with up to kMaxGroupWarps warps: the bound keeps its registers within what a block of
// 1,024 threads may hold (unbounded, the top-k takes 80 registers: too many for 1,024 threads).
template <int kPerLane>
__global__ void __launch_bounds__(kMaxGroupWarps* kWarp)
    RouteKernel(const float* logits, int n_tokens, int n_experts, int top_k, bool normalize,
                int32_t* ids, float* weights, int32_t* n_active_out, int32_t* experts,
                int32_t* begin, int32_t* token_of, float* weight_of, int32_t* assign_of) {
  PdlWait();
  extern __shared__ int4 shared_raw[];
  const int n_warps = blockDim.x / kWarp;
  for (int t = threadIdx.x / kWarp; t < n_tokens; t += n_warps)
    TopKToken<kPerLane>(logits, t, n_experts, top_k, normalize, ids, weights);
  __syncthreads();
  GroupAssignments(ids, weights, n_tokens * top_k, top_k, n_experts, n_active_out, experts, begin,
                   token_of, weight_of, assign_of, shared_raw);
}

// ---- a decode step's routing, one warp a token ---------------------------------------------

// Steps of at most kWarp assignments (n_tokens * top_k): warp t chooses token t's experts, then
// warp 0 groups them with a lane an assignment, without block-wide scans: the same results as
// TopKKernel then GroupKernel.
constexpr int kMaxWarpRouteTokens = 16;

// Warp 0's grouping of the n_assign <= 32 assignments in id[] / weight[] (shared), lane i
// holding assignment i. Assignment i's slot is the number of assignments of lower experts plus
// those of its expert before it (stable, as Routing::Group); an expert's rank among the active
// ones is the number of lower active experts.
__device__ void WarpGroup(const int32_t* id, const float* weight, int n_assign, int top_k,
                          int n_experts, int32_t* n_active_out, int32_t* experts, int32_t* begin,
                          int32_t* token_of, float* weight_of, int32_t* assign_of) {
  const int lane = threadIdx.x % kWarp;
  const bool valid = lane < n_assign;
  const int e = valid ? id[lane] : INT32_MAX;
  const unsigned same = __match_any_sync(0xffffffffu, e);
  const bool first = valid && __ffs(same) - 1 == lane;  // the expert's first assignment
  int lower = 0;                                        // assignments of lower experts
  int lower_active = 0;                                 // active experts below e
  for (int j = 0; j < n_assign; ++j) {
    const int ej = __shfl_sync(0xffffffffu, e, j);
    const int fj = __shfl_sync(0xffffffffu, first ? 1 : 0, j);
    lower += ej < e ? 1 : 0;
    lower_active += fj != 0 && ej < e ? 1 : 0;
  }
  const int n_active = __popc(__ballot_sync(0xffffffffu, first));
  if (first) {
    experts[lower_active] = e;
    begin[lower_active] = lower;
  }
  for (int a = n_active + lane; a <= n_experts; a += kWarp) begin[a] = n_assign;
  if (lane == 0) *n_active_out = n_active;
  if (!valid) return;
  const int pos = lower + __popc(same & ((1u << lane) - 1u));
  const int t = lane / top_k;
  const int j = lane - t * top_k;
  token_of[pos] = t;
  weight_of[pos] = weight[lane];
  // This assignment's place among token t's, experts ascending (ties: the earlier first).
  int order = 0;
  for (int k = 0; k < top_k; ++k) {
    const int other = id[t * top_k + k];
    order += other < e || (other == e && k < j) ? 1 : 0;
  }
  assign_of[t * top_k + order] = pos;
}

// n_tokens warps (<= kMaxWarpRouteTokens), n_tokens * top_k <= 32.
template <int kPerLane>
__global__ void __launch_bounds__(kMaxWarpRouteTokens* kWarp)
    WarpRouteKernel(const float* logits, int n_tokens, int n_experts, int top_k, bool normalize,
                    int32_t* ids, float* weights, int32_t* n_active_out, int32_t* experts,
                    int32_t* begin, int32_t* token_of, float* weight_of, int32_t* assign_of) {
  PdlWait();
  __shared__ int32_t s_id[kWarp];
  __shared__ float s_weight[kWarp];
  const int t = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const LaneChoice c = TopKLanes<kPerLane>(logits, t, n_experts, top_k, normalize);
  if (lane < top_k) {
    const int i = t * top_k + lane;
    ids[i] = c.id;
    weights[i] = c.weight;
    s_id[i] = c.id;
    s_weight[i] = c.weight;
  }
  __syncthreads();
  if (t == 0)
    WarpGroup(s_id, s_weight, n_tokens * top_k, top_k, n_experts, n_active_out, experts, begin,
              token_of, weight_of, assign_of);
}

}  // namespace

void LaunchTopK(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t top_k,
                bool normalize, int32_t* ids, float* weights, cudaStream_t stream) {
  // n_experts <= kMaxTopKExperts and top_k <= kMaxTopK <= n_experts: the model loader checks.
  if (n_tokens <= 0 || n_experts <= 0 || n_experts > kMaxTopKExperts || top_k <= 0 ||
      top_k > kMaxTopK || top_k > n_experts)
    return;
  const int64_t blocks = (n_tokens + kTopKWarpsPerBlock - 1) / kTopKWarpsPerBlock;
  ByExpertsPerLane(n_experts, [&]<int kPerLane>() {
    Launch(TopKKernel<kPerLane>, static_cast<unsigned>(blocks), kTopKWarpsPerBlock * kWarp, 0,
           stream, logits, n_tokens, static_cast<int>(n_experts), static_cast<int>(top_k),
           normalize, ids, weights);
  });
}

void LaunchGroupByExpert(const int32_t* ids, const float* weights, const DeviceRouting& r,
                         cudaStream_t stream) {
  if (r.n_experts <= 0 || r.top_k <= 0 || r.n_tokens < 0) return;
  const int64_t n_assign = r.n_assignments();
  GroupLayout plan = PlanGroup(r.n_experts, n_assign);
  if (plan.shared_bytes > kDefaultSharedBytes) {      // very many experts: one warp, opt-in memory
    if (plan.shared_bytes > kMaxSharedBytes) return;  // beyond any model we know; loader checks
    cudaFuncSetAttribute(GroupKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(plan.shared_bytes));
  }
  Launch(GroupKernel, 1, plan.warps * kWarp, plan.shared_bytes, stream, ids, weights,
         static_cast<int>(n_assign), static_cast<int>(r.top_k), static_cast<int>(r.n_experts),
         r.n_active, r.experts, r.begin, r.token_of, r.weight_of, r.assign_of);
}

void LaunchRoute(const float* logits, bool normalize, int32_t* ids, float* weights,
                 const DeviceRouting& r, cudaStream_t stream) {
  if (r.n_tokens <= 0 || r.n_experts <= 0 || r.n_experts > kMaxTopKExperts || r.top_k <= 0 ||
      r.top_k > kMaxTopK || r.top_k > r.n_experts)
    return;
  if (r.n_assignments() <= kWarp && r.n_tokens <= kMaxWarpRouteTokens) {
    return ByExpertsPerLane(r.n_experts, [&]<int kPerLane>() {
      Launch(WarpRouteKernel<kPerLane>, 1, static_cast<unsigned>(r.n_tokens) * kWarp, 0, stream,
             logits, static_cast<int>(r.n_tokens), static_cast<int>(r.n_experts),
             static_cast<int>(r.top_k), normalize, ids, weights, r.n_active, r.experts, r.begin,
             r.token_of, r.weight_of, r.assign_of);
    });
  }
  const GroupLayout plan = PlanGroup(r.n_experts, r.n_assignments(), r.n_tokens);
  if (!FusedLaunches() || r.n_tokens > kMaxFusedRouteTokensPerWarp * plan.warps ||
      plan.shared_bytes > kDefaultSharedBytes) {
    LaunchTopK(logits, r.n_tokens, r.n_experts, r.top_k, normalize, ids, weights, stream);
    return LaunchGroupByExpert(ids, weights, r, stream);
  }
  ByExpertsPerLane(r.n_experts, [&]<int kPerLane>() {
    Launch(RouteKernel<kPerLane>, 1, plan.warps * kWarp, plan.shared_bytes, stream, logits,
           static_cast<int>(r.n_tokens), static_cast<int>(r.n_experts), static_cast<int>(r.top_k),
           normalize, ids, weights, r.n_active, r.experts, r.begin, r.token_of, r.weight_of,
           r.assign_of);
  });
}

}  // namespace moetier::cuda
