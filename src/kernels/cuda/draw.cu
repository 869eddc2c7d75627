// Tokens drawn on the GPU (draw.h). A row is cut into slices of whole float4s, one block of
// kThreads a slice (many blocks a row, so that one row's draw spreads over the SMs), and drawn in
// up to kSweeps + 2 launches over the row's slices, handing what the next needs on through the
// row's RowScratch:
//   DrawMaxKernel: each slice's largest logit and first non-finite one (and the row's scratch
//     cleared);
//   DrawSweepKernel, kSweeps times, for rows with top-p: a radix sweep over the logits'
//     order-preserving key (kDigitBits a sweep, from the top) that histograms the weights W of
//     the tokens whose keys lie in the range the sweeps before it narrowed down;
//   DrawPickKernel: from the histograms, the key of the last token top-p keeps and how many of
//     its ties (lowest ids first); each slice's kept W and its ties; the block that finishes last
//     finds the slice holding floor(u * the row's kept W) and walks it, a warp a segment, to the
//     token.
// Every kernel derives the row's maximum and the sweeps' digits itself from the scratch (a few
// hundred values) rather than waiting for one block to. Every sum is of integers: neither the
// order the threads add in nor the slicing changes a token.
#include "kernels/cuda/draw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/launch.h"

namespace moetier::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
constexpr int kSweeps = 32 / kDigitBits;
constexpr int kChunk = 4 * kWarp;   // a warp's tokens at a time: 4 consecutive ones a lane
constexpr int kMaxSlices = 256;     // blocks a row at most (a multiple of kWarp)
constexpr int64_t kMinSlice = 512;  // tokens a slice at least, where the row allows
constexpr float kWeightScale = 0x1p44f;
// Below e^kNoWeight a weight is under 2^-45 (e^-31.19), whose W is 0.
constexpr float kNoWeight = -32.0f;
// W (at most 2^44) is added by warps in two halves whose sums over 32 lanes fit 32 bits.
constexpr int kLowBits = 22;

// A row's state between the launches of its draw (DrawScratchBytes: one a row).
struct RowScratch {
  unsigned long long mass[kSweeps][kDigits];  // each radix sweep's W by digit
  uint32_t count[kSweeps][kDigits];           // and how many tokens
  float slice_max[kMaxSlices];
  unsigned long long slice_kept[kMaxSlices];  // kept W of each slice, the cut key's tokens aside
  uint32_t slice_ties[kMaxSlices];            // each slice's tokens of the cut key
  uint32_t done;                              // slices DrawPickKernel has summed
};

struct Weighed {
  float w = 0.0f;            // e^((v - max) * inv_t); 0 for a non-finite v
  unsigned long long W = 0;  // round(w * 2^44)
};

__device__ __forceinline__ Weighed Weigh(float v, float max, float inv_t) {
  if (!Finite(v)) return {};
  // Equal to the maximum: exactly 1, also when inv_t is infinite (a tiny temperature).
  if (v == max) return {1.0f, static_cast<unsigned long long>(kWeightScale)};
  const float d = (v - max) * inv_t;
  if (!(d > kNoWeight)) return {};
  const float w = expf(d);
  return {w, __float2ull_rn(w * kWeightScale)};
}

// x[i, i + 4); past n: NaN, which weighs nothing.
__device__ __forceinline__ void Load4(const float* x, int64_t i, int64_t n, bool aligned,
                                      float v[4]) {
  if (aligned && i + 4 <= n) {
    const float4 q = *reinterpret_cast<const float4*>(x + i);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    return;
  }
  for (int k = 0; k < 4; ++k) v[k] = i + k < n ? x[i + k] : NAN;
}

template <typename T>
__device__ __forceinline__ T WarpInclusiveScan(T v, int lane) {
#pragma unroll
  for (int o = 1; o < kWarp; o <<= 1) {
    const T t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

__device__ __forceinline__ unsigned long long WarpSumU64(unsigned long long v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where top-p and min-p cut the row.
struct Cut {
  bool top_p = false;   // off: every key is kept
  uint32_t key = 0;     // the key of the last token top-p keeps
  bool ranked = false;  // only the first keep_ties tokens (by id) of that key are kept
  uint32_t keep_ties = 0;
  float min_p = 0.0f;
};

// Adds W to the bin of every lane with `in`, one shared-memory atomic a bin a warp: lanes of
// one bin found by __match_any_sync, their W summed in 32-bit halves. Every lane of the warp
// calls it.
__device__ __forceinline__ void AddToBin(bool in, uint32_t bin, unsigned long long W, int lane,
                                         unsigned long long* mass, uint32_t* count) {
  const unsigned active = __ballot_sync(0xffffffffu, in);
  if (!in) return;
  const unsigned peers = __match_any_sync(active, bin);
  const uint32_t lo = __reduce_add_sync(peers, static_cast<uint32_t>(W & ((1u << kLowBits) - 1)));
  const uint32_t hi = __reduce_add_sync(peers, static_cast<uint32_t>(W >> kLowBits));
  if (lane == __ffs(peers) - 1) {
    atomicAdd(&mass[bin], (static_cast<unsigned long long>(hi) << kLowBits) + lo);
    atomicAdd(&count[bin], static_cast<uint32_t>(__popc(peers)));
  }
}

// The kept W of this lane's 4 tokens of a chunk; `ties_before` (warp-uniform): the cut key's
// tokens before the chunk in the row, advanced past it when the cut is ranked.
__device__ __forceinline__ void KeptWeights(const float v[4], const Cut& cut, float max,
                                            float inv_t, int lane, uint32_t& ties_before,
                                            unsigned long long W[4]) {
  Weighed q[4];
  uint32_t key[4];
  bool tie[4];
  uint32_t lane_ties = 0;
  for (int k = 0; k < 4; ++k) {
    key[k] = OrderKey(v[k]);
    // Below top-p's cut: no weight to compute (the cut key's tokens weigh: tie_w > 0).
    const bool below = cut.top_p && key[k] < cut.key;
    q[k] = below ? Weighed{} : Weigh(v[k], max, inv_t);
    tie[k] = cut.top_p && Finite(v[k]) && key[k] == cut.key;
    lane_ties += tie[k] ? 1u : 0u;
  }
  uint32_t rank = 0;
  if (cut.ranked) {
    const uint32_t incl = WarpInclusiveScan(lane_ties, lane);
    rank = ties_before + incl - lane_ties;
    ties_before += __shfl_sync(0xffffffffu, incl, kWarp - 1);
  }
  for (int k = 0; k < 4; ++k) {
    bool keep = q[k].W != 0 && q[k].w >= cut.min_p;
    if (cut.top_p)
      keep = keep && (key[k] > cut.key || (tie[k] && (!cut.ranked || rank < cut.keep_ties)));
    rank += tie[k] ? 1u : 0u;
    W[k] = keep ? q[k].W : 0;
  }
}

// Warp `warp`'s contiguous segment of a slice of n tokens: whole chunks, the last warps' maybe
// empty.
__device__ __forceinline__ int64_t SegmentLength(int64_t n) {
  const int64_t per_warp = (n + kWarps - 1) / kWarps;
  return (per_warp + kChunk - 1) / kChunk * kChunk;
}

// [begin, end) of slice `slice` of `slices` over a row of n: whole float4s, the last maybe empty.
struct Slice {
  int64_t begin, end;
};
__device__ __forceinline__ Slice SliceOf(int64_t n, int slice, int slices) {
  const int64_t per = ((n + slices - 1) / slices + 3) / 4 * 4;
  const int64_t begin = min(n, per * slice);
  return {begin, min(n, begin + per)};
}

__device__ __forceinline__ bool Aligned(const float* x, int64_t n) {
  return n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// The row's largest logit from its slices' (DrawMaxKernel); every thread gets it.
__device__ float RowMax(const RowScratch& rs, float& shared_max) {
  if (threadIdx.x < kWarp) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < static_cast<int>(gridDim.x); s += kWarp)
      m = fmaxf(m, rs.slice_max[s]);
    m = WarpMax(m);
    if (threadIdx.x == 0) shared_max = m;
  }
  __syncthreads();
  return shared_max;
}

// Where the first sweeps narrowed top-p's cut: the key bits found, the W of the tokens whose keys
// lie above their range, and the W top-p needs; after the last sweep, the cut key's tokens and
// the W of each.
struct CutState {
  uint32_t prefix;
  unsigned long long above;
  unsigned long long need;  // ceil(top_p * the row's W)
  uint32_t ties;
  unsigned long long tie_w;
};

// Warp 0: the digits the first `sweeps` sweeps' histograms choose, each the one holding the
// need-th unit of W counted from the top. A lane loads its bins of a sweep at once, in flight
// together rather than one after another; every kernel but the one choosing the first digit
// begins here.
__device__ void FollowDigits(const RowScratch& rs, int sweeps, float top_p, CutState& c) {
  constexpr int kPer = kDigits / kWarp;
  const int lane = threadIdx.x;
  const int top = kDigits - 1 - lane * kPer;   // this lane's bins: top, top - 1, ...
  if (lane == 0) c = CutState{0, 0, 0, 0, 0};  // so where nothing weighs (every logit non-finite)
  __syncwarp();
  for (int sweep = 0; sweep < sweeps; ++sweep) {
    unsigned long long mass[kPer];  // bins top, top - 1, ...
    uint32_t count[kPer];
    unsigned long long mine = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      mass[j] = rs.mass[sweep][top - j];
      count[j] = rs.count[sweep][top - j];
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) mine += mass[j];
    if (sweep == 0) {
      const unsigned long long total = WarpSumU64(mine);
      const auto need = static_cast<unsigned long long>(
          ceil(static_cast<double>(top_p) * static_cast<double>(total)));
      if (lane == 0) c.need = min(max(need, 1ull), total);
      __syncwarp();
    }
    const unsigned long long above = c.above, need = c.need;
    __syncwarp();  // every lane has read them before one lane moves them on
    const unsigned long long incl = WarpInclusiveScan(mine, lane);
    const unsigned long long before = above + incl - mine;
    if (before < need && before + mine >= need) {  // one lane: its bin holding the need-th
      unsigned long long acc = before, bin_mass = 0;
      uint32_t bin_count = 0;
      int digit = top;
      bool found = false;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (!found && acc + mass[j] >= need) {
          found = true;
          digit = top - j;
          bin_mass = mass[j];
          bin_count = count[j];
        }
        if (!found) acc += mass[j];
      }
      c.prefix |= static_cast<uint32_t>(digit) << (32 - kDigitBits * (sweep + 1));
      c.above = acc;
      c.ties = bin_count;
      c.tie_w = bin_count != 0 ? bin_mass / bin_count : 0;
    }
    __syncwarp();
  }
}

// The cut of the last sweep's state; min-p beside it.
__device__ Cut CutOf(const CutState& c, bool top_p, float min_p) {
  Cut cut;
  cut.min_p = min_p;
  if (!top_p) return cut;
  cut.top_p = true;
  cut.key = c.prefix;
  const unsigned long long short_by = c.need - c.above;  // > 0, at most ties * tie_w
  const auto keep =
      c.tie_w != 0 ? static_cast<uint32_t>((short_by + c.tie_w - 1) / c.tie_w) : c.ties;
  cut.keep_ties = min(keep, c.ties);
  cut.ranked = cut.keep_ties < c.ties;
  return cut;
}

__global__ void __launch_bounds__(kThreads)
    DrawMaxKernel(const float* x, int64_t n, const RowDraw* draws, RowScratch* scratch,
                  unsigned long long* first) {
  PdlWait();
  const int64_t row = blockIdx.y;
  const RowDraw d = draws[row];
  if (!(d.u >= 0.0)) return;
  RowScratch& rs = scratch[row];
  if (d.top_p < 1.0f) {  // the sweeps' histograms, for the launches after this one
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < kSweeps * kDigits;
         i += gridDim.x * kThreads) {
      (&rs.mass[0][0])[i] = 0;
      (&rs.count[0][0])[i] = 0;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) rs.done = 0;
  const Slice sl = SliceOf(n, blockIdx.x, gridDim.x);
  const float* xr = x + row * n;
  const bool aligned = Aligned(x, n);
  float m = -INFINITY;
  unsigned long long bad = ~0ull;  // the first non-finite logit's index in x
  for (int64_t i = sl.begin + 4 * threadIdx.x; i < sl.end; i += 4 * kThreads) {
    float v[4];
    Load4(xr, i, sl.end, aligned, v);
    for (int k = 0; k < 4 && i + k < sl.end; ++k) {
      if (Finite(v[k]))
        m = fmaxf(m, v[k]);
      else
        bad = min(bad, static_cast<unsigned long long>(row * n + i + k));
    }
  }
  if (bad != ~0ull && first != nullptr) atomicMin(first, bad);
  __shared__ float warp_max[kWarps];
  m = WarpMax(m);
  if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (float w : warp_max) m = fmaxf(m, w);
    rs.slice_max[blockIdx.x] = m;
  }
}

// Radix sweep `sweep` of the rows with top-p: the W of the slice's tokens whose keys' higher
// digits are the ones the sweeps before chose, by this sweep's digit, into the row's histogram.
__global__ void __launch_bounds__(kThreads)
    DrawSweepKernel(const float* x, int64_t n, const RowDraw* draws, RowScratch* scratch,
                    int sweep) {
  PdlWait();
  const int64_t row = blockIdx.y;
  const RowDraw d = draws[row];
  if (!(d.u >= 0.0) || !(d.top_p < 1.0f)) return;
  RowScratch& rs = scratch[row];
  __shared__ unsigned long long mass[kDigits];
  __shared__ uint32_t count[kDigits];
  __shared__ float shared_max;
  __shared__ CutState state;
  for (int b = threadIdx.x; b < kDigits; b += kThreads) {
    mass[b] = 0;
    count[b] = 0;
  }
  const float max = RowMax(rs, shared_max);
  if (sweep > 0 && threadIdx.x < kWarp) FollowDigits(rs, sweep, d.top_p, state);
  __syncthreads();
  const int shift = 32 - kDigitBits * (sweep + 1);
  const uint32_t high = sweep == 0 ? 0u : state.prefix >> (shift + kDigitBits);
  const int lane = threadIdx.x % kWarp;
  const Slice sl = SliceOf(n, blockIdx.x, gridDim.x);
  const float* xr = x + row * n;
  const bool aligned = Aligned(x, n);
  for (int64_t base = sl.begin + 4 * static_cast<int64_t>(threadIdx.x - lane); base < sl.end;
       base += 4 * kThreads) {
    float v[4];
    Load4(xr, base + 4 * lane, sl.end, aligned, v);
    for (float c : v) {
      // Outside the prefix found so far: no weight to compute.
      const uint32_t key = OrderKey(c);
      const bool prefixed = sweep == 0 || (key >> (shift + kDigitBits)) == high;
      const unsigned long long W = prefixed ? Weigh(c, max, d.inv_temperature).W : 0;
      AddToBin(W != 0, (key >> shift) & (kDigits - 1), W, lane, mass, count);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kDigits; b += kThreads) {
    if (count[b] == 0) continue;
    atomicAdd(&rs.mass[sweep][b], mass[b]);
    atomicAdd(&rs.count[sweep][b], count[b]);
  }
}

// What DrawPickKernel's last block shares.
struct PickShared {
  float max;
  CutState state;
  bool last;
  unsigned long long warp_kept[kWarps];
  uint32_t warp_ties[kWarps];
  // Written by FindSlice: the kept W of the slices before each and their cut-key tokens.
  unsigned long long slice_base[kMaxSlices];
  uint32_t slice_ties_before[kMaxSlices];
  unsigned long long target;
  int slice;   // the one whose kept W holds the target; -1: none (nothing weighs)
  int walker;  // the warp whose segment of it holds the target
};

// This thread's tokens of the slice (strided float4s): the kept W of those above the cut key
// (every one without top-p) and how many are the cut key's.
__device__ void TallySlice(const float* xr, Slice sl, bool aligned, const Cut& cut, float max,
                           float inv_t, unsigned long long& kept, uint32_t& ties) {
  for (int64_t i = sl.begin + 4 * threadIdx.x; i < sl.end; i += 4 * kThreads) {
    float v[4];
    Load4(xr, i, sl.end, aligned, v);
    for (float c : v) {
      const uint32_t key = OrderKey(c);
      if (cut.top_p && key <= cut.key) {
        ties += Finite(c) && key == cut.key ? 1u : 0u;
        continue;
      }
      const Weighed q = Weigh(c, max, inv_t);
      kept += q.W != 0 && q.w >= cut.min_p ? q.W : 0;
    }
  }
}

// The last block's warp 0: each slice's kept W (its cut-key tokens counted in id order against
// keep_ties), the target, and the slice that holds it. A lane takes kSlicesPerLane consecutive
// slices; scans over the lanes give the counts before each.
__device__ void FindSlice(const RowScratch& rs, const Cut& cut, float max, float inv_t, double u,
                          PickShared& s) {
  constexpr int kSlicesPerLane = kMaxSlices / kWarp;
  if (threadIdx.x >= kWarp) return;
  const int slices = static_cast<int>(gridDim.x), lane = static_cast<int>(threadIdx.x);
  const int first = lane * kSlicesPerLane;
  unsigned long long kept[kSlicesPerLane];
  uint32_t ties[kSlicesPerLane];
  uint32_t lane_ties = 0;
#pragma unroll
  for (int j = 0; j < kSlicesPerLane; ++j) {
    const bool in = first + j < slices;
    kept[j] = in ? __ldcg(&rs.slice_kept[first + j]) : 0;
    ties[j] = in ? __ldcg(&rs.slice_ties[first + j]) : 0;
    lane_ties += ties[j];
  }
  // Every cut-key token has the same W; min-p keeps all of them or none.
  const Weighed tie = cut.top_p ? Weigh(FromOrderKey(cut.key), max, inv_t) : Weighed{};
  const unsigned long long tie_W = tie.W != 0 && tie.w >= cut.min_p ? tie.W : 0;
  uint32_t ties_before = WarpInclusiveScan(lane_ties, lane) - lane_ties;
  unsigned long long lane_kept = 0;
#pragma unroll
  for (int j = 0; j < kSlicesPerLane; ++j) {
    const uint32_t room = cut.keep_ties > ties_before ? cut.keep_ties - ties_before : 0u;
    kept[j] += tie_W * min(room, ties[j]);
    if (first + j < slices) s.slice_ties_before[first + j] = ties_before;
    ties_before += ties[j];
    lane_kept += kept[j];
  }
  const unsigned long long incl = WarpInclusiveScan(lane_kept, lane);
  const unsigned long long total = __shfl_sync(0xffffffffu, incl, kWarp - 1);
  const auto pick = static_cast<unsigned long long>(u * static_cast<double>(total));
  const unsigned long long target = total == 0 ? 0 : min(pick, total - 1);
  if (lane == 0) {
    s.target = target;
    s.slice = -1;
  }
  __syncwarp();
  unsigned long long base = incl - lane_kept;
#pragma unroll
  for (int j = 0; j < kSlicesPerLane; ++j) {
    if (first + j < slices) s.slice_base[first + j] = base;
    if (base <= target && base + kept[j] > target) s.slice = first + j;  // one slice holds it
    base += kept[j];
  }
}

// The last block: the token of the slice that holds the target. Each warp sums the kept W of
// its segment of the slice (after counting its cut-key tokens, for their ranks, when only some
// are kept), and the warp whose segment holds the target walks it: chunk by chunk, a scan of the
// lanes' kept W finds the lane, then its token.
__device__ void WalkSlice(const float* xr, int64_t n, bool aligned, const Cut& cut, float max,
                          float inv_t, PickShared& s, LogitCandidate* out, int32_t* count) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const Slice sl = SliceOf(n, s.slice, gridDim.x);
  const int64_t seg = SegmentLength(sl.end - sl.begin);
  const int64_t begin = min(sl.end, sl.begin + warp * seg), end = min(sl.end, begin + seg);
  if (cut.ranked) {
    uint32_t ties = 0;
    for (int64_t i = begin; i < end; i += kChunk) {
      float v[4];
      Load4(xr, i + 4 * lane, end, aligned, v);
      for (float c : v) ties += Finite(c) && OrderKey(c) == cut.key ? 1u : 0u;
    }
    for (int o = kWarp / 2; o > 0; o >>= 1) ties += __shfl_xor_sync(0xffffffffu, ties, o);
    if (lane == 0) s.warp_ties[warp] = ties;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t acc = s.slice_ties_before[s.slice];
      for (int w = 0; w < kWarps; ++w) {
        const uint32_t mine = s.warp_ties[w];
        s.warp_ties[w] = acc;
        acc += mine;
      }
    }
    __syncthreads();
  }
  uint32_t ties = cut.ranked ? s.warp_ties[warp] : 0u;
  unsigned long long sum = 0;
  for (int64_t i = begin; i < end; i += kChunk) {
    float v[4];
    unsigned long long W[4];
    Load4(xr, i + 4 * lane, end, aligned, v);
    KeptWeights(v, cut, max, inv_t, lane, ties, W);
    sum += W[0] + W[1] + W[2] + W[3];
  }
  sum = WarpSumU64(sum);
  if (lane == 0) s.warp_kept[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long acc = s.slice_base[s.slice];
    for (int w = 0; w < kWarps; ++w) {
      const unsigned long long mine = s.warp_kept[w];
      s.warp_kept[w] = acc;
      acc += mine;
    }
    s.walker = -1;
    for (int w = 0; w < kWarps; ++w)
      if (s.warp_kept[w] <= s.target && (w + 1 == kWarps ? acc : s.warp_kept[w + 1]) > s.target)
        s.walker = w;
  }
  __syncthreads();
  if (warp != s.walker) return;
  const unsigned long long target = s.target;
  unsigned long long running = s.warp_kept[warp];
  ties = cut.ranked ? s.warp_ties[warp] : 0u;
  for (int64_t i = begin; i < end; i += kChunk) {
    float v[4];
    unsigned long long W[4];
    Load4(xr, i + 4 * lane, end, aligned, v);
    KeptWeights(v, cut, max, inv_t, lane, ties, W);
    const unsigned long long mine = W[0] + W[1] + W[2] + W[3];
    const unsigned long long incl = WarpInclusiveScan(mine, lane);
    const unsigned past = __ballot_sync(0xffffffffu, running + incl > target);
    if (past == 0) {
      running += __shfl_sync(0xffffffffu, incl, kWarp - 1);
      continue;
    }
    if (lane == __ffs(past) - 1) {
      unsigned long long acc = running + incl - mine;
      for (int k = 0; k < 4; ++k) {
        acc += W[k];
        if (acc > target) {
          *out = LogitCandidate{v[k], static_cast<int32_t>(i + 4 * lane + k)};
          *count = 1;
          break;
        }
      }
    }
    return;
  }
}

__global__ void __launch_bounds__(kThreads)
    DrawPickKernel(const float* x, int64_t n, const RowDraw* draws, RowScratch* scratch,
                   LogitCandidate* out, int32_t* counts) {
  PdlWait();
  const int64_t row = blockIdx.y;
  const RowDraw d = draws[row];
  if (!(d.u >= 0.0)) return;
  RowScratch& rs = scratch[row];
  __shared__ PickShared s;
  const float max = RowMax(rs, s.max);
  const bool top_p = d.top_p < 1.0f;
  if (top_p && threadIdx.x < kWarp) FollowDigits(rs, kSweeps, d.top_p, s.state);
  __syncthreads();
  const Cut cut = CutOf(s.state, top_p, d.min_p);
  const float* xr = x + row * n;
  const bool aligned = Aligned(x, n);

  // This slice's kept W and cut-key tokens, then whether it is the last to finish.
  unsigned long long kept = 0;
  uint32_t ties = 0;
  TallySlice(xr, SliceOf(n, blockIdx.x, gridDim.x), aligned, cut, max, d.inv_temperature, kept,
             ties);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  kept = WarpSumU64(kept);
  for (int o = kWarp / 2; o > 0; o >>= 1) ties += __shfl_xor_sync(0xffffffffu, ties, o);
  if (lane == 0) {
    s.warp_kept[warp] = kept;
    s.warp_ties[warp] = ties;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    kept = 0;
    ties = 0;
    for (int w = 0; w < kWarps; ++w) {
      kept += s.warp_kept[w];
      ties += s.warp_ties[w];
    }
    rs.slice_kept[blockIdx.x] = kept;
    rs.slice_ties[blockIdx.x] = ties;
    __threadfence();  // the sums are visible before the count says so
    s.last = atomicAdd(&rs.done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s.last) return;
  __threadfence();

  FindSlice(rs, cut, max, d.inv_temperature, d.u, s);
  __syncthreads();
  if (s.slice < 0) {  // every logit non-finite: the step fails on its scan
    if (threadIdx.x == 0) {
      out[row * kMaxLogitCandidates] = LogitCandidate{max, 0};
      counts[row] = 1;
    }
    return;
  }
  WalkSlice(xr, n, aligned, cut, max, d.inv_temperature, s, out + row * kMaxLogitCandidates,
            counts + row);
}

// Slices a row: none under kMinSlice tokens (unless the row is shorter), launch.h's
// BlocksPerRow.
int SlicesPerRow(int64_t n, int64_t n_rows) {
  return static_cast<int>(BlocksPerRow((n + kMinSlice - 1) / kMinSlice, n_rows, kMaxSlices));
}

}  // namespace

size_t DrawScratchBytes(int64_t n_rows) {
  return static_cast<size_t>(std::max<int64_t>(n_rows, 0)) * sizeof(RowScratch);
}

void LaunchDrawRows(const float* x, int64_t n_rows, int64_t n, const RowDraw* draws, DrawWork work,
                    void* scratch, LogitCandidate* out, int32_t* counts, unsigned long long* first,
                    cudaStream_t stream, int slices) {
  if (n_rows <= 0 || n <= 0 || !work.any) return;
  if (slices <= 0) slices = SlicesPerRow(n, n_rows);
  const dim3 grid(static_cast<unsigned>(std::min(slices, kMaxSlices)),
                  static_cast<unsigned>(n_rows));
  auto* rows = static_cast<RowScratch*>(scratch);
  Launch(DrawMaxKernel, grid, kThreads, 0, stream, x, n, draws, rows, first);
  if (work.top_p)
    for (int sweep = 0; sweep < kSweeps; ++sweep)
      Launch(DrawSweepKernel, grid, kThreads, 0, stream, x, n, draws, rows, sweep);
  Launch(DrawPickKernel, grid, kThreads, 0, stream, x, n, draws, rows, out, counts);
}

}  // namespace moetier::cuda
