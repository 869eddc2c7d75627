// Element-wise and per-row kernels (elementwise.h). Each is memory-bound and tiny next to the
// matrix products; the goal is coalesced access and no launch for empty inputs, not peak
// bandwidth tricks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride kernels launch at most this many blocks: enough to fill 132 SMs many times over,
// few enough that each thread does several elements of a long vector.
constexpr int64_t kMaxGridBlocks = 4096;

int GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxGridBlocks ? blocks : kMaxGridBlocks);
}

__device__ __forceinline__ uint16_t LoadU16(const uint8_t* p) {  // p 2-byte aligned
  return *reinterpret_cast<const uint16_t*>(p);
}

// Element c of a table row as float32, exactly as kernels::RowToF32 decodes it (every value is
// exact in float32, so the results are bit-identical).
template <DType kD>
__device__ __forceinline__ float RowElement(const uint8_t* row, int64_t c) {
  if constexpr (kD == DType::kF32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (kD == DType::kF16) {
    return F16BitsToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
  } else if constexpr (kD == DType::kBF16) {
    return Bf16BitsToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
  } else if constexpr (kD == DType::kQ8_0) {
    const uint8_t* blk = row + (c / 32) * 34;
    const int8_t q = static_cast<int8_t>(blk[2 + c % 32]);
    return F16BitsToFloat(LoadU16(blk)) * static_cast<float>(q);
  } else {  // kQ4_0: byte j holds elements j (low nibble) and j + 16 (high nibble)
    const uint8_t* blk = row + (c / 32) * 18;
    const int j = static_cast<int>(c % 32);
    const uint8_t byte = blk[2 + (j & 15)];
    const int code = j < 16 ? (byte & 15) : (byte >> 4);
    return F16BitsToFloat(LoadU16(blk)) * static_cast<float>(code - 8);
  }
}

// One block per token: h[t, :] = decoded row tokens[t].
template <DType kD>
__global__ void EmbedKernel(const uint8_t* table, int64_t row_bytes, int64_t cols,
                            const int32_t* tokens, float* h) {
  PdlWait();
  const int64_t t = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(tokens[t]) * row_bytes;
  float* out = h + t * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = RowElement<kD>(row, c);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The order is fixed, so a given input always gives the same bits.
__device__ double BlockSum(double v, double* warp_sums /* [32] shared */) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int n_warps = blockDim.x / kWarp;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < n_warps; ++w) total += warp_sums[w];
  return total;
}

// Rows of up to kThreads * kNormRegs elements (d_model 4096) are held in registers by the
// normalization kernels: every load of a row is issued before the first is used.
constexpr int kNormRegs = 16;

// The warp's smallest `mine` into *first (one atomicMin, and only when a lane has one: the common
// all-finite case does no atomics at all). ~0ull: none.
__device__ __forceinline__ void ReportFirst(unsigned long long mine, unsigned long long* first) {
  if (!__any_sync(0xffffffffu, mine != ~0ull)) return;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, mine, o);
    mine = other < mine ? other : mine;
  }
  if (threadIdx.x % kWarp == 0) atomicMin(first, mine);
}

// What a norm writes beside y: its sums' first non-finite index (as FirstNonFiniteKernel
// reports it) when `first` is set, y quantized when yq.q is (rows held in registers, whole
// 32-blocks: NormQuantizes).
struct NormExtras {
  unsigned long long* first = nullptr;
  QuantizedActs yq;
};

// One block per output row: y = x[r] * scale * weight, x[r] first gaining `add`'s row r when
// `add` is not null (written back to x: the residual add fused with the norm that follows it).
// The sum of squares is kept in double, as kernels::RmsNormRow does (a few thousand squares lose
// bits in float32); fp64 is cheap on the GPUs we target next to the row's memory traffic. Only
// the summation order differs from the CPU, so the scale agrees to about 1 ulp of float32. Each
// thread sums its elements in column order whether the row is held in registers or not: the
// same bits either way. In registers, warp w holds columns 32w..32w+31 (+ 256j) in its lanes:
// one 32-block each, which QuantizeLane quantizes as the products' quantizers do.
__global__ void RmsNormKernel(float* x, const float* add, const int32_t* rows, const float* weight,
                              float eps, int64_t d, float* y, NormExtras extras) {
  // The weights are the model's, written before any step: loaded before PdlWait, their latency
  // overlaps the wait for the kernel before.
  const bool in_registers = d <= static_cast<int64_t>(blockDim.x) * kNormRegs;
  float wt[kNormRegs];
  if (in_registers) {
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      wt[j] = c < d ? weight[c] : 0.0f;
    }
  }
  PdlWait();
  __shared__ double warp_sums[kWarp];
  const int64_t i = blockIdx.x;
  const int64_t r = rows != nullptr ? rows[i] : i;
  float* xr = x + r * d;
  const float* ar = add != nullptr ? add + r * d : nullptr;
  float* yr = y + i * d;
  double ss = 0.0;
  unsigned long long bad = ~0ull;  // the thread's first non-finite index of x[r]
  if (in_registers) {
    float v[kNormRegs];
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      v[j] = c < d ? xr[c] : 0.0f;
      if (ar != nullptr && c < d) v[j] += ar[c];
    }
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (c >= d) continue;
      if (ar != nullptr) xr[c] = v[j];
      ss += static_cast<double>(v[j]) * static_cast<double>(v[j]);
      if (!Finite(v[j]) && bad == ~0ull) bad = static_cast<unsigned long long>(r * d + c);
    }
    if (extras.first != nullptr) ReportFirst(bad, extras.first);
    ss = BlockSum(ss, warp_sums);
    const float scale = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
    const QuantizedActs& q = extras.yq;
#pragma unroll
    for (int j = 0; j < kNormRegs; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (c >= d) continue;  // warp-uniform where q.q is set (d % 32 == 0)
      const float out = v[j] * scale * wt[j];
      yr[c] = out;
      if (q.q != nullptr) {
        float dq;
        q.q[i * d + c] = QuantizeLane(out, &dq);
        if (threadIdx.x % kWarp == 0) q.d[(i * d + c) / kWarp] = dq;
      }
    }
    return;
  }
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float v = xr[c];
    if (ar != nullptr) xr[c] = v = v + ar[c];
    ss += static_cast<double>(v) * static_cast<double>(v);
    if (!Finite(v) && bad == ~0ull) bad = static_cast<unsigned long long>(r * d + c);
  }
  if (extras.first != nullptr) ReportFirst(bad, extras.first);
  ss = BlockSum(ss, warp_sums);
  const float scale = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) yr[c] = xr[c] * scale * weight[c];
}

__global__ void AddKernel(const float* x, int64_t n, float* y) {
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// silu(g) * up as the CPU computes it: g / (1 + e^-g) * up (IEEE division; expf is within
// 2 ulp of the CPU's exp).
__global__ void SiluMulKernel(float* gate, const float* up, int64_t n) {
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// Each thread keeps the lowest non-finite index it saw; ReportFirst takes the warp's.
__global__ void FirstNonFiniteKernel(const float* x, int64_t n, unsigned long long* first) {
  PdlWait();
  unsigned long long mine = ~0ull;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!Finite(x[i])) {
      mine = static_cast<unsigned long long>(i);
      break;  // later i of this thread are larger
    }
  }
  ReportFirst(mine, first);
}

// An element's arg-max key: larger values give larger keys (the value's bits in an order that
// compares as unsigned), and on equal values the lower index the larger key (its complement in
// the low word). 0 is below every key.
__device__ __forceinline__ unsigned long long ArgMaxKey(float v, int64_t i) {
  const uint32_t bits = __float_as_uint(v);
  const uint32_t ordered = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<unsigned long long>(ordered) << 32) | ~static_cast<uint32_t>(i);
}

// Elements of a row a block of the arg-max takes, at least: one row spreads over a few dozen
// blocks (a 151,936-entry vocabulary: 64), so that a single row is not one SM's read.
constexpr int64_t kArgMaxBlockElems = 2048;
constexpr int64_t kMaxArgMaxBlocksPerRow = 64;

// grid (blocks a row, rows): each block reduces its stride of the row to one key and takes the
// row's maximum with one atomicMax; non-finite elements never win and are reported as
// FirstNonFiniteKernel reports them.
__global__ void ArgMaxRowsKernel(const float* x, int64_t n, unsigned long long* keys,
                                 unsigned long long* first) {
  PdlWait();
  __shared__ unsigned long long warp_best[kThreads / kWarp];
  const int64_t row = blockIdx.y;
  const float* xr = x + row * n;
  // A thread's indices ascend: a strictly larger value is a better one, an equal one is not.
  float best_v = -INFINITY;
  int64_t best_i = -1;
  unsigned long long bad = ~0ull;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = xr[i];
    if (!Finite(v)) {
      bad = min(bad, static_cast<unsigned long long>(row * n + i));
    } else if (best_i < 0 || v > best_v) {
      best_v = v;
      best_i = i;
    }
  }
  unsigned long long best = best_i < 0 ? 0 : ArgMaxKey(best_v, best_i);
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
    const unsigned long long other_bad = __shfl_xor_sync(0xffffffffu, bad, o);
    bad = other_bad < bad ? other_bad : bad;
  }
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) {
    warp_best[warp] = best;
    if (bad != ~0ull && first != nullptr) atomicMin(first, bad);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x) / kWarp; ++w)
      best = warp_best[w] > best ? warp_best[w] : best;  // best: warp 0's already
    if (best != 0) atomicMax(keys + row, best);
  }
}

template <DType kD>
void Embed(const DeviceMatrix& table, const int32_t* tokens, int64_t n_tokens, float* h,
           cudaStream_t stream) {
  const auto row_bytes = static_cast<int64_t>(DTypeRowBytes(table.dtype, table.cols));
  Launch(EmbedKernel<kD>, static_cast<unsigned>(n_tokens), kThreads, 0, stream,
         static_cast<const uint8_t*>(table.data), row_bytes, table.cols, tokens, h);
}

}  // namespace

void LaunchEmbed(const DeviceMatrix& table, const int32_t* tokens, int64_t n_tokens, float* h,
                 cudaStream_t stream) {
  if (n_tokens <= 0 || table.cols <= 0) return;
  switch (table.dtype) {
    case DType::kF32:
      return Embed<DType::kF32>(table, tokens, n_tokens, h, stream);
    case DType::kF16:
      return Embed<DType::kF16>(table, tokens, n_tokens, h, stream);
    case DType::kBF16:
      return Embed<DType::kBF16>(table, tokens, n_tokens, h, stream);
    case DType::kQ8_0:
      return Embed<DType::kQ8_0>(table, tokens, n_tokens, h, stream);
    case DType::kQ4_0:
      return Embed<DType::kQ4_0>(table, tokens, n_tokens, h, stream);
    default:
      return;  // not a table dtype (the loader rejects it before)
  }
}

bool NormQuantizes(int64_t d) {
  return d > 0 && d % kWarp == 0 && d <= static_cast<int64_t>(kThreads) * kNormRegs;
}

void LaunchRmsNorm(const float* x, const int32_t* rows, int64_t n_rows, const float* weight,
                   float eps, int64_t d, float* y, cudaStream_t stream, QuantizedActs yq) {
  if (n_rows <= 0 || d <= 0) return;
  NormExtras extras;
  if (NormQuantizes(d)) extras.yq = yq;
  // Read only: add is null.
  Launch(RmsNormKernel, static_cast<unsigned>(n_rows), kThreads, 0, stream, const_cast<float*>(x),
         nullptr, rows, weight, eps, d, y, extras);
}

void LaunchAddRmsNorm(const float* x, int64_t n_rows, float* h, const float* weight, float eps,
                      int64_t d, float* y, cudaStream_t stream, unsigned long long* first,
                      QuantizedActs yq) {
  if (n_rows <= 0 || d <= 0) return;
  NormExtras extras;
  extras.first = first;
  if (NormQuantizes(d)) extras.yq = yq;
  Launch(RmsNormKernel, static_cast<unsigned>(n_rows), kThreads, 0, stream, h, x, nullptr, weight,
         eps, d, y, extras);
}

void LaunchAdd(const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  Launch(AddKernel, GridFor(n), kThreads, 0, stream, x, n, y);
}

void LaunchSiluMul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Launch(SiluMulKernel, GridFor(n), kThreads, 0, stream, gate, up, n);
}

void LaunchFirstNonFinite(const float* x, int64_t n, unsigned long long* first,
                          cudaStream_t stream) {
  if (n <= 0) return;
  Launch(FirstNonFiniteKernel, GridFor(n), kThreads, 0, stream, x, n, first);
}

void LaunchArgMaxRows(const float* x, int64_t n_rows, int64_t n, unsigned long long* keys,
                      unsigned long long* first, cudaStream_t stream) {
  if (n_rows <= 0) return;
  cudaMemsetAsync(keys, 0, static_cast<size_t>(n_rows) * sizeof(unsigned long long), stream);
  if (n <= 0) return;
  const int64_t per_row = std::clamp<int64_t>(n / kArgMaxBlockElems, 1, kMaxArgMaxBlocksPerRow);
  Launch(ArgMaxRowsKernel, dim3(static_cast<unsigned>(per_row), static_cast<unsigned>(n_rows)),
         kThreads, 0, stream, x, n, keys, first);
}

}  // namespace moetier::cuda
