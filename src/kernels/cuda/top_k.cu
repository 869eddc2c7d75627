// Top-k candidates of logit rows (top_k.h), in three launches:
// 1. a histogram of each row's finite values by the top 12 bits of an order-preserving key
//    (sign, exponent, 3 bits of mantissa: bins an eighth of an octave wide), blocks of a row
//    adding into its global histogram, and the non-finite scan;
// 2. every block finds the bin holding the row's k-th largest value from that histogram and
//    gathers the values in it or above (a few dozen in a real model's logits) into the row's
//    collection;
// 3. one block a row sorts its collection (value descending, index ascending) and keeps those
//    at least the k-th.
#include "kernels/cuda/top_k.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/launch.h"

namespace moetier::cuda {
namespace {

constexpr int kBins = 4096;
constexpr int kBinShift = 20;  // 32-bit key >> 20: 12 bits
constexpr int kThreads = 256;
constexpr int kSortThreads = 1024;
// Values a thread of the histogram and gather kernels loads together before it counts any (the
// loads in flight at once, not one after another), and so a block's: the grid takes a row's
// length over it, at most launch.h's BlocksPerRow. On an H100 (Nsight Compute, 151,936 logits)
// 74 blocks of 2,048 take 5.8 us for the histogram and 6.7 for the gather; 18 blocks of 8,192
// loading one value at a time (32 dependent loads a thread) take 19.5 and 21.
constexpr int kPerThread = 8;
constexpr int64_t kBlockElems = kThreads * kPerThread;
constexpr int64_t kMaxBlocksPerRow = 128;
// The scratch of one row: its histogram, then how many values its gather found, then them.
struct RowScratch {
  uint32_t hist[kBins];
  uint32_t collected;
  uint32_t pad[3];
  unsigned long long values[kTopKCollect];  // SortKey of each
};

// Descending order of this key is the candidates' order: value descending, index ascending.
__device__ __forceinline__ unsigned long long SortKey(float v, int64_t i) {
  return (static_cast<unsigned long long>(OrderKey(v)) << 32) |
         static_cast<unsigned long long>(~static_cast<uint32_t>(i));
}

// f(x[i], i) for this thread's values of a row of n (grid-strided), kPerThread loaded at a time.
template <typename F>
__device__ __forceinline__ void ForEachValue(const float* xr, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i0 < n;
       i0 += stride * kPerThread) {
    float v[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) v[k] = i0 + k * stride < n ? xr[i0 + k * stride] : 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      if (i0 + k * stride < n) f(v[k], i0 + k * stride);
  }
}

__global__ void TopKHistogramKernel(const float* x, int64_t n, RowScratch* scratch,
                                    unsigned long long* first) {
  PdlWait();
  __shared__ uint32_t hist[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  const int64_t row = blockIdx.y;
  const float* xr = x + row * n;
  unsigned long long bad = ~0ull;
  ForEachValue(xr, n, [&](float v, int64_t i) {
    if (Finite(v))
      atomicAdd(&hist[OrderKey(v) >> kBinShift], 1u);
    else
      bad = min(bad, static_cast<unsigned long long>(row * n + i));
  });
  if (bad != ~0ull && first != nullptr) atomicMin(first, bad);
  __syncthreads();
  uint32_t* global = scratch[row].hist;
  for (int b = threadIdx.x; b < kBins; b += blockDim.x)
    if (hist[b] != 0) atomicAdd(&global[b], hist[b]);
}

// The bin of the row's k-th largest finite value (the lowest bin when it has fewer): every
// thread loads kBins / blockDim.x bins from the top at once (in flight together), a scan over
// threads finds the crossing.
__device__ int KthBin(const uint32_t* hist, int32_t k) {
  __shared__ uint32_t sums[kThreads];
  __shared__ int found;
  constexpr int kPer = kBins / kThreads;
  const int t = threadIdx.x;
  const int top = kBins - 1 - t * kPer;  // this thread's bins: top, top - 1, ..., top - kPer + 1
  uint32_t bins[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) bins[j] = hist[top - j];
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) mine += bins[j];
  sums[t] = mine;
  if (t == 0) found = 0;
  __syncthreads();
  // Inclusive scan from the top bins down (Hillis-Steele; 256 entries).
  for (int o = 1; o < kThreads; o <<= 1) {
    const uint32_t add = t >= o ? sums[t - o] : 0;
    __syncthreads();
    sums[t] += add;
    __syncthreads();
  }
  const uint32_t before = t > 0 ? sums[t - 1] : 0;
  const auto need = static_cast<uint32_t>(k);
  if (before < need && sums[t] >= need) {
    uint32_t acc = before;
    int bin = top;
    bool crossed = false;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      acc += bins[j];
      if (!crossed && acc >= need) {
        crossed = true;
        bin = top - j;
      }
    }
    found = bin;
  }
  __syncthreads();
  return found;  // 0 when no thread crossed: fewer than k finite values, every bin counts
}

__global__ void TopKGatherKernel(const float* x, int64_t n, int32_t k, RowScratch* scratch) {
  PdlWait();
  const int64_t row = blockIdx.y;
  RowScratch& s = scratch[row];
  const uint32_t floor_bin = static_cast<uint32_t>(KthBin(s.hist, k));
  const float* xr = x + row * n;
  ForEachValue(xr, n, [&](float v, int64_t i) {
    if (!Finite(v) || (OrderKey(v) >> kBinShift) < floor_bin) return;
    const uint32_t slot = atomicAdd(&s.collected, 1u);
    if (slot < static_cast<uint32_t>(kTopKCollect)) s.values[slot] = SortKey(v, i);
  });
}

__global__ void __launch_bounds__(kSortThreads)
    TopKSelectKernel(int32_t k, RowScratch* scratch, LogitCandidate* out, int32_t* counts) {
  PdlWait();
  __shared__ unsigned long long keys[kTopKCollect];
  const int64_t row = blockIdx.x;
  const RowScratch& s = scratch[row];
  const uint32_t collected = s.collected;
  if (collected > static_cast<uint32_t>(kTopKCollect)) {
    if (threadIdx.x == 0) counts[row] = -1;
    return;
  }
  const auto m = static_cast<int>(collected);
  int size = 1;
  while (size < m) size <<= 1;
  for (int i = threadIdx.x; i < size; i += blockDim.x) keys[i] = i < m ? s.values[i] : 0ull;
  __syncthreads();
  // Bitonic sort, descending.
  for (int len = 2; len <= size; len <<= 1) {
    for (int stride = len / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const bool descending = (i & len) == 0;
        const unsigned long long a = keys[i], b = keys[j];
        if (descending ? a < b : a > b) {
          keys[i] = b;
          keys[j] = a;
        }
      }
      __syncthreads();
    }
  }
  // The k-th largest (every value when fewer) and its ties: a prefix of the order.
  const int kth = min(k, m) - 1;
  const uint32_t floor_key = kth >= 0 ? static_cast<uint32_t>(keys[kth] >> 32) : 0u;
  __shared__ int n_keep;
  if (threadIdx.x == 0) n_keep = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += blockDim.x)
    if (static_cast<uint32_t>(keys[i] >> 32) >= floor_key) atomicMax(&n_keep, i + 1);
  __syncthreads();
  const int keep = kth >= 0 ? n_keep : 0;
  if (keep > kMaxLogitCandidates) {
    if (threadIdx.x == 0) counts[row] = -1;
    return;
  }
  LogitCandidate* o = out + row * kMaxLogitCandidates;
  for (int i = threadIdx.x; i < keep; i += blockDim.x) {
    o[i].logit = FromOrderKey(static_cast<uint32_t>(keys[i] >> 32));
    o[i].id = static_cast<int32_t>(~static_cast<uint32_t>(keys[i]));
  }
  if (threadIdx.x == 0) counts[row] = keep;
}

}  // namespace

size_t TopKScratchBytes(int64_t n_rows) {
  return static_cast<size_t>(n_rows) * sizeof(RowScratch);
}

void LaunchTopKRows(const float* x, int64_t n_rows, int64_t n, int32_t k, void* scratch,
                    LogitCandidate* out, int32_t* counts, unsigned long long* first,
                    cudaStream_t stream) {
  if (n_rows <= 0) return;
  auto* rows = static_cast<RowScratch*>(scratch);
  cudaMemsetAsync(rows, 0, TopKScratchBytes(n_rows), stream);
  k = std::clamp(k, 1, kMaxCandidateTopK);
  const dim3 grid(static_cast<unsigned>(BlocksPerRow(n / kBlockElems, n_rows, kMaxBlocksPerRow)),
                  static_cast<unsigned>(n_rows));
  if (n > 0) {
    Launch(TopKHistogramKernel, grid, kThreads, 0, stream, x, n, rows, first);
    Launch(TopKGatherKernel, grid, kThreads, 0, stream, x, n, k, rows);
  }
  Launch(TopKSelectKernel, static_cast<unsigned>(n_rows), kSortThreads, 0, stream, k, rows, out,
         counts);
}

}  // namespace moetier::cuda
