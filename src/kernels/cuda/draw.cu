// Tokens drawn on the GPU (draw.h), one block of kThreads a row: the row's maximum; for top-p,
// kSweeps radix sweeps over the logits' order-preserving key (kDigitBits a sweep, from the top)
// that histogram the weights W and narrow down the key of the last token top-p keeps (with how
// many of its ties, by id); then each warp sums the kept W of its contiguous segment of the row,
// and the warp whose segment holds floor(u * their sum) walks it to the token. Every sum is of
// integers: the order the threads add in changes nothing.
#include "kernels/cuda/draw.h"

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / kWarp;
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
constexpr int kSweeps = 32 / kDigitBits;
constexpr int kChunk = 4 * kWarp;  // a warp's tokens at a time: 4 consecutive ones a lane
constexpr float kWeightScale = 0x1p44f;
// Below e^kNoWeight a weight is under 2^-45 (e^-31.19), whose W is 0.
constexpr float kNoWeight = -32.0f;
// W (at most 2^44) is added by warps in two halves whose sums over 32 lanes fit 32 bits.
constexpr int kLowBits = 22;

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

struct Shared {
  unsigned long long mass[kDigits];  // a radix sweep's W by digit
  uint32_t count[kDigits];           // and how many tokens
  float warp_max[kWarps];
  unsigned long long warp_sum[kWarps];  // kept W of each warp's segment, then their bases
  uint32_t warp_ties[kWarps];           // top-p's ties in each warp's segment, then their bases
  float max;
  uint32_t prefix;           // the key bits the radix sweeps found so far
  unsigned long long above;  // W of the tokens whose keys lie above the prefix's range
  unsigned long long need;   // ceil(top_p * the row's W)
  uint32_t ties;             // tokens of the cut key
  unsigned long long tie_w;  // and the W of each
  unsigned long long target;
  int walker;  // the warp whose segment holds the target
};

// Adds W to the bin of every lane with `in`, one shared-memory atomic a bin a warp: lanes of
// one bin found by __match_any_sync, their W summed in 32-bit halves. Every lane of the warp
// calls it.
__device__ __forceinline__ void AddToBin(bool in, uint32_t bin, unsigned long long W, int lane,
                                         Shared& s) {
  const unsigned active = __ballot_sync(0xffffffffu, in);
  if (!in) return;
  const unsigned peers = __match_any_sync(active, bin);
  const uint32_t lo = __reduce_add_sync(peers, static_cast<uint32_t>(W & ((1u << kLowBits) - 1)));
  const uint32_t hi = __reduce_add_sync(peers, static_cast<uint32_t>(W >> kLowBits));
  if (lane == __ffs(peers) - 1) {
    atomicAdd(&s.mass[bin], (static_cast<unsigned long long>(hi) << kLowBits) + lo);
    atomicAdd(&s.count[bin], static_cast<uint32_t>(__popc(peers)));
  }
}

__device__ void RowMax(const float* x, int64_t n, bool aligned, Shared& s) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  float m = -INFINITY;
  for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < n; i += 4 * kThreads) {
    float v[4];
    Load4(x, i, n, aligned, v);
    for (float c : v) m = Finite(c) ? fmaxf(m, c) : m;
  }
  m = WarpMax(m);
  if (lane == 0) s.warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = WarpMax(s.warp_max[lane]);
    if (lane == 0) s.max = m;
  }
  __syncthreads();
}

// Warp 0, after a radix sweep's histogram: the digit holding the need-th unit of W counted from
// the top, appended to the prefix.
__device__ void ChooseDigit(Shared& s, int sweep, int shift, float top_p) {
  constexpr int kPer = kDigits / kWarp;
  const int lane = threadIdx.x;
  const int top = kDigits - 1 - lane * kPer;  // this lane's bins: top, top - 1, ...
  unsigned long long mine = 0;
  for (int j = 0; j < kPer; ++j) mine += s.mass[top - j];
  if (sweep == 0) {
    const unsigned long long total = WarpSumU64(mine);
    const auto need = static_cast<unsigned long long>(
        ceil(static_cast<double>(top_p) * static_cast<double>(total)));
    if (lane == 0) s.need = min(max(need, 1ull), total);
    __syncwarp();
  }
  const unsigned long long above = s.above, need = s.need;
  __syncwarp();  // every lane has read them before one lane moves them on
  const unsigned long long incl = WarpInclusiveScan(mine, lane);
  const unsigned long long before = above + incl - mine;
  if (before < need && before + mine >= need) {  // one lane
    unsigned long long acc = before;
    int d = top;
    for (int j = 0; j < kPer; ++j, --d) {
      if (acc + s.mass[d] >= need) break;
      acc += s.mass[d];
    }
    s.prefix |= static_cast<uint32_t>(d) << shift;
    s.above = acc;
    s.ties = s.count[d];
    s.tie_w = s.count[d] != 0 ? s.mass[d] / s.count[d] : 0;
  }
}

// The cut of top-p: kSweeps radix sweeps.
__device__ Cut TopPCut(const float* x, int64_t n, bool aligned, float inv_t, float top_p,
                       Shared& s) {
  const int lane = threadIdx.x % kWarp;
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.above = 0;
    s.ties = 0;  // stay so only where nothing weighs (every logit non-finite)
    s.tie_w = 0;
  }
  const float max = s.max;
  for (int sweep = 0; sweep < kSweeps; ++sweep) {
    const int shift = 32 - kDigitBits * (sweep + 1);
    for (int b = threadIdx.x; b < kDigits; b += kThreads) {
      s.mass[b] = 0;
      s.count[b] = 0;
    }
    __syncthreads();
    const uint32_t high = sweep == 0 ? 0u : s.prefix >> (shift + kDigitBits);
    for (int64_t base = 4 * static_cast<int64_t>(threadIdx.x - lane); base < n;
         base += 4 * kThreads) {
      float v[4];
      Load4(x, base + 4 * lane, n, aligned, v);
      for (float c : v) {
        // Outside the prefix found so far: no weight to compute.
        const uint32_t key = OrderKey(c);
        const bool prefixed = sweep == 0 || (key >> (shift + kDigitBits)) == high;
        const unsigned long long W = prefixed ? Weigh(c, max, inv_t).W : 0;
        AddToBin(W != 0, (key >> shift) & (kDigits - 1), W, lane, s);
      }
    }
    __syncthreads();
    if (threadIdx.x < kWarp) ChooseDigit(s, sweep, shift, top_p);
    __syncthreads();
  }
  Cut cut;
  cut.top_p = true;
  cut.key = s.prefix;
  const unsigned long long short_by = s.need - s.above;  // > 0, at most ties * tie_w
  const auto keep =
      s.tie_w != 0 ? static_cast<uint32_t>((short_by + s.tie_w - 1) / s.tie_w) : s.ties;
  cut.keep_ties = min(keep, s.ties);
  cut.ranked = cut.keep_ties < s.ties;
  return cut;
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

// Warp `warp`'s contiguous segment of the row: whole chunks, the last warps' maybe empty.
__device__ __forceinline__ int64_t SegmentLength(int64_t n) {
  const int64_t per_warp = (n + kWarps - 1) / kWarps;
  return (per_warp + kChunk - 1) / kChunk * kChunk;
}

// Each warp's count of the cut key's tokens, then (thread 0) their exclusive prefix.
__device__ void CountTies(const float* x, int64_t n, bool aligned, const Cut& cut, Shared& s) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t seg = SegmentLength(n);
  const int64_t end = min(n, (warp + 1) * seg);
  uint32_t ties = 0;
  for (int64_t i = warp * seg; i < end; i += kChunk) {
    float v[4];
    Load4(x, i + 4 * lane, n, aligned, v);
    for (float c : v) ties += Finite(c) && OrderKey(c) == cut.key ? 1u : 0u;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) ties += __shfl_xor_sync(0xffffffffu, ties, o);
  if (lane == 0) s.warp_ties[warp] = ties;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t acc = 0;
    for (int w = 0; w < kWarps; ++w) {
      const uint32_t mine = s.warp_ties[w];
      s.warp_ties[w] = acc;
      acc += mine;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    DrawRowsKernel(const float* x, int64_t n, const RowDraw* draws, LogitCandidate* out,
                   int32_t* counts) {
  PdlWait();
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  const RowDraw d = draws[row];
  if (!(d.u >= 0.0)) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const float* xr = x + row * n;
  const bool aligned = n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  RowMax(xr, n, aligned, s);
  const float max = s.max;
  Cut cut;
  if (d.top_p < 1.0f) cut = TopPCut(xr, n, aligned, d.inv_temperature, d.top_p, s);
  cut.min_p = d.min_p;
  if (cut.ranked) CountTies(xr, n, aligned, cut, s);

  // Each warp's kept W, then (thread 0) their exclusive prefix, the target and its warp.
  const int64_t seg = SegmentLength(n);
  const int64_t begin = warp * seg, end = min(n, begin + seg);
  uint32_t ties = cut.ranked ? s.warp_ties[warp] : 0u;
  unsigned long long sum = 0;
  for (int64_t i = begin; i < end; i += kChunk) {
    float v[4];
    unsigned long long W[4];
    Load4(xr, i + 4 * lane, n, aligned, v);
    KeptWeights(v, cut, max, d.inv_temperature, lane, ties, W);
    sum += W[0] + W[1] + W[2] + W[3];
  }
  sum = WarpSumU64(sum);
  if (lane == 0) s.warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kWarps; ++w) {
      const unsigned long long mine = s.warp_sum[w];
      s.warp_sum[w] = total;
      total += mine;
    }
    const auto pick = static_cast<unsigned long long>(d.u * static_cast<double>(total));
    s.target = total == 0 ? 0 : min(pick, total - 1);
    s.walker = -1;
    for (int w = 0; w < kWarps; ++w)
      if (s.warp_sum[w] <= s.target && (w + 1 == kWarps ? total : s.warp_sum[w + 1]) > s.target)
        s.walker = w;
    if (total == 0) {  // every logit non-finite: the step fails on its scan
      out[row * kMaxLogitCandidates] = LogitCandidate{max, 0};
      counts[row] = 1;
    }
  }
  __syncthreads();
  if (warp != s.walker) return;

  // The walk: chunk by chunk, a scan of the lanes' kept W finds the lane, then its token.
  const unsigned long long target = s.target;
  unsigned long long running = s.warp_sum[warp];
  ties = cut.ranked ? s.warp_ties[warp] : 0u;
  for (int64_t i = begin; i < end; i += kChunk) {
    float v[4];
    unsigned long long W[4];
    Load4(xr, i + 4 * lane, n, aligned, v);
    KeptWeights(v, cut, max, d.inv_temperature, lane, ties, W);
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
          out[row * kMaxLogitCandidates] =
              LogitCandidate{v[k], static_cast<int32_t>(i + 4 * lane + k)};
          counts[row] = 1;
          break;
        }
      }
    }
    return;
  }
}

}  // namespace

void LaunchDrawRows(const float* x, int64_t n_rows, int64_t n, const RowDraw* draws,
                    LogitCandidate* out, int32_t* counts, cudaStream_t stream) {
  if (n_rows <= 0 || n <= 0) return;
  Launch(DrawRowsKernel, static_cast<unsigned>(n_rows), kThreads, 0, stream, x, n, draws, out,
         counts);
}

}  // namespace moetier::cuda
