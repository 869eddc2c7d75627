// Attention over the paged KV cache on the GPU: the prologue kernel (biases, q/k norms, RoPE, the
// cache append) and the launcher that picks the decode (attention_decode.cuh) or the prefill
// (attention_prefill.cuh) kernel.
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_prefill.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {

namespace attention {
namespace {

// ---- Prologue -------------------------------------------------------------------------------

inline constexpr int kPrologueWarps = 4;  // rows per block of 128 threads

struct PrologueParams {
  QkvPrologue w;
  float* q = nullptr;  // [T, n_heads, D]
  float* k = nullptr;  // [T, n_kv_heads, D]
  float* v = nullptr;  // [T, n_kv_heads, D]
  const int32_t* positions = nullptr;
  const int32_t* seq_of = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  PoolRef pool;
  DType dtype = DType::kF32;
  int64_t n_tokens = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  float eps = 0.0f;
};

// Stores a float at element i of a pool row, rounded to the pool's dtype (nearest even).
__device__ __forceinline__ void StoreElem(uint8_t* row, DType dtype, int i, float x) {
  if (dtype == DType::kF32) {
    reinterpret_cast<float*>(row)[i] = x;
  } else if (dtype == DType::kBF16) {
    reinterpret_cast<uint16_t*>(row)[i] = FloatToBf16Bits(x);
  } else {
    reinterpret_cast<uint16_t*>(row)[i] = FloatToF16Bits(x);
  }
}

// One warp per (token, row): row r < n_heads is a query head, then the key heads, then the value
// heads. Lane holds the pairs (i, i + D/2) for i = lane + 32 j. The arithmetic is the CPU's
// (backend/cpu/paged_attention.cpp, backend/rope.cpp) operation for operation, with products
// and sums rounded separately (no fused multiply-add): the sum of squares in double, the angle
// position * inv_freq and its cosine and sine in double, then rounded to float.
template <int D>
__global__ void __launch_bounds__(kPrologueWarps* kWarp) PrologueKernel(PrologueParams p) {
  PdlWait();
  constexpr int kHalf = D / 2;
  constexpr int kPairs = (kHalf + kWarp - 1) / kWarp;
  const int rows = p.n_heads + 2 * p.n_kv_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kPrologueWarps + threadIdx.x / kWarp;
  if (item >= p.n_tokens * rows) return;  // uniform over the warp
  const int lane = threadIdx.x % kWarp;
  const int64_t t = item / rows;
  const int r = static_cast<int>(item % rows);
  const bool is_q = r < p.n_heads;
  const bool is_v = r >= p.n_heads + p.n_kv_heads;
  const int head = is_q ? r : is_v ? r - p.n_heads - p.n_kv_heads : r - p.n_heads;
  float* x = is_q   ? p.q + (t * p.n_heads + head) * D
             : is_v ? p.v + (t * p.n_kv_heads + head) * D
                    : p.k + (t * p.n_kv_heads + head) * D;
  const float* bias = is_q ? p.w.q_bias : is_v ? p.w.v_bias : p.w.k_bias;
  const float* norm = is_q ? p.w.q_norm : is_v ? nullptr : p.w.k_norm;

  float a[kPairs], b[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + kWarp * j;
    a[j] = b[j] = 0.0f;
    if (i < kHalf) {
      a[j] = x[i];
      b[j] = x[i + kHalf];
      if (bias != nullptr) {
        a[j] = __fadd_rn(a[j], bias[head * D + i]);
        b[j] = __fadd_rn(b[j], bias[head * D + i + kHalf]);
      }
    }
  }
  if (norm != nullptr) {  // uniform over the warp
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      ss = __fma_rn(static_cast<double>(a[j]), static_cast<double>(a[j]), ss);
      ss = __fma_rn(static_cast<double>(b[j]), static_cast<double>(b[j]), ss);
    }
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float scale = static_cast<float>(1.0 / sqrt(ss / D + static_cast<double>(p.eps)));
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + kWarp * j;
      if (i < kHalf) {
        a[j] = __fmul_rn(__fmul_rn(a[j], scale), norm[i]);
        b[j] = __fmul_rn(__fmul_rn(b[j], scale), norm[i + kHalf]);
      }
    }
  }
  if (!is_v) {
    const double pos = p.positions[t];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + kWarp * j;
      if (i >= kHalf) continue;
      double sn, cs;
      sincos(pos * static_cast<double>(p.w.inv_freq[i]), &sn, &cs);
      const float c = static_cast<float>(cs);
      const float s = static_cast<float>(sn);
      const float a2 = __fsub_rn(__fmul_rn(a[j], c), __fmul_rn(b[j], s));
      const float b2 = __fadd_rn(__fmul_rn(b[j], c), __fmul_rn(a[j], s));
      a[j] = a2;
      b[j] = b2;
    }
  }
  uint8_t* row = nullptr;
  if (!is_q) {
    const int32_t pos = p.positions[t];
    const int32_t* table = p.block_tables + static_cast<int64_t>(p.seq_of[t]) * p.max_blocks;
    row = p.pool.data + KeyRowOffset(p.pool, table, pos) + (is_v ? p.pool.plane_bytes : 0) +
          static_cast<int64_t>(head) * D * p.pool.elem_bytes;
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + kWarp * j;
    if (i >= kHalf) continue;
    x[i] = a[j];
    x[i + kHalf] = b[j];
    if (row != nullptr) {
      StoreElem(row, p.dtype, i, a[j]);
      StoreElem(row, p.dtype, i + kHalf, b[j]);
    }
  }
}

// ---- Launch planning --------------------------------------------------------------------------

// Calls of at most this many tokens go to the decode kernel: a decode batch is one token per
// sequence, which the prefill kernel's tiles would serve one pass per token, unsplit. Short
// chunks of one sequence read its K/V once per token there, from L2 mostly (one layer of a
// 4k-position sequence is a few MiB; the H200's L2 holds 50).
inline constexpr int64_t kDecodeMaxTokens = 64;
// The prefill kernel gives each thread head_dim / 16 output columns; smaller heads (the test
// fixtures' 8) take the decode kernel at every token count, one block per token.
inline constexpr int kPrefillMinHeadDim = 16;
// Blocks the decode kernel aims for: about 4 per SM of an H200 (132 SMs), enough loads in flight
// to approach HBM bandwidth.
inline constexpr int64_t kDecodeTargetBlocks = 528;
// Fewest positions per split, and the split granularity (MOETIER_CUDA_ATTN_CHUNK): short
// contexts spread over more blocks, each a tile or two of keys, against fewer blocks that each
// walk several tiles in turn (a block's fixed work: q loads, the team merge, the partial state).
int64_t MinChunk() {
  return AttentionMinChunk();
}

int64_t Context(const AttentionDims& dims, int64_t max_position) {
  const int64_t n = max_position + 1;
  return dims.sliding_window > 0 ? std::min(n, dims.sliding_window) : n;
}

int64_t DecodeSlices(const AttentionDims& dims) {
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  return (group + kDecodeHeads - 1) / kDecodeHeads;
}

int64_t PartialBytes(const AttentionDims& dims, int64_t n_tokens, int64_t splits) {
  return n_tokens * dims.n_heads * splits * (dims.head_dim + 2) *
         static_cast<int64_t>(sizeof(float));
}

struct DecodePlan {
  int64_t chunk = 0;
  int64_t splits = 0;
};

// Splits of each token's context: enough blocks for the GPU, no chunk under MinChunk(), and no
// more partial states than `scratch_bytes` holds.
DecodePlan PlanDecode(const AttentionDims& dims, int64_t n_tokens, int64_t context,
                      int64_t scratch_bytes) {
  const int64_t units = n_tokens * dims.n_kv_heads * DecodeSlices(dims);
  int64_t splits = (kDecodeTargetBlocks + units - 1) / units;
  const int64_t min_chunk = MinChunk();
  splits = std::min(splits, (context + min_chunk - 1) / min_chunk);
  const int64_t fit = scratch_bytes / PartialBytes(dims, n_tokens, 1);
  if (splits > 1 && splits > fit) splits = fit;
  splits = std::max<int64_t>(splits, 1);
  DecodePlan plan;
  plan.chunk = (context + splits - 1) / splits;
  plan.chunk = (plan.chunk + min_chunk - 1) / min_chunk * min_chunk;
  plan.splits = (context + plan.chunk - 1) / plan.chunk;
  return plan;
}

PoolRef MakePoolRef(const DeviceKvPool& kv, const AttentionDims& dims, int64_t layer) {
  PoolRef r;
  r.data = static_cast<uint8_t*>(kv.data);
  r.n_layers = kv.n_layers;
  r.layer = layer;
  r.elem_bytes = static_cast<int32_t>(DTypeSize(kv.dtype));
  r.row_bytes = dims.n_kv_heads * dims.head_dim * r.elem_bytes;
  r.plane_bytes = kv.block_size * r.row_bytes;
  r.block_size = static_cast<int32_t>(kv.block_size);
  return r;
}

template <int D>
void LaunchPrologueD(const PrologueParams& p, cudaStream_t stream) {
  const int64_t items = p.n_tokens * (p.n_heads + 2 * p.n_kv_heads);
  const int64_t blocks = (items + kPrologueWarps - 1) / kPrologueWarps;
  Launch(PrologueKernel<D>, static_cast<unsigned>(blocks), kPrologueWarps * kWarp, 0, stream, p);
}

template <int D, typename Kv>
void LaunchDecodeD(const DecodeParams& p, int64_t n_tokens, int64_t n_kv_heads,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(n_kv_heads * p.slices),
                  static_cast<unsigned>(n_tokens));
  if (p.group <= 4) {
    Launch(DecodeKernel<D, Kv, 4>, grid, kDecodeThreads, 0, stream, p);
  } else {
    Launch(DecodeKernel<D, Kv, kDecodeHeads>, grid, kDecodeThreads, 0, stream, p);
  }
  if (p.splits > 1) {
    const dim3 combine(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(n_tokens));
    Launch(DecodeCombineKernel, combine, D, 0, stream, p, D);
  }
}

template <int D, typename Kv>
void LaunchPrefillD(const PrefillParams& p, int64_t n_kv_heads, cudaStream_t stream) {
  constexpr size_t kSmem = PrefillShape<D>::kSmemBytes;
  // Above the 48 KiB default the kernel must opt in; a host-side attribute, allowed while a
  // stream is being captured.
  if constexpr (kSmem > 48 * 1024)
    cudaFuncSetAttribute(PrefillKernel<D, Kv>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(kSmem));
  const int64_t tiles = (p.n_tokens + p.tokens_per_tile - 1) / p.tokens_per_tile;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(n_kv_heads * p.slices));
  Launch(PrefillKernel<D, Kv>, grid, kPrefillThreads, kSmem, stream, p);
}

[[noreturn]] void Unsupported(const char* what, int64_t value) {
  std::fprintf(stderr, "moetier: CUDA attention does not support %s %lld\n", what,
               static_cast<long long>(value));
  std::abort();
}

// Calls f.template operator()<D, Kv>() for the dims' head_dim and the pool's dtype.
template <typename F>
void DispatchDimAndKv(int64_t head_dim, DType dtype, F&& f) {
  auto with_kv = [&]<int D>() {
    switch (dtype) {
      case DType::kF32:
        return f.template operator()<D, KvF32>();
      case DType::kBF16:
        return f.template operator()<D, KvBf16>();
      case DType::kF16:
        return f.template operator()<D, KvF16>();
      default:
        Unsupported("KV dtype", static_cast<int64_t>(dtype));
    }
  };
  switch (head_dim) {
    case 8:
      return with_kv.template operator()<8>();
    case 16:
      return with_kv.template operator()<16>();
    case 32:
      return with_kv.template operator()<32>();
    case 64:
      return with_kv.template operator()<64>();
    case 128:
      return with_kv.template operator()<128>();
    case 256:
      return with_kv.template operator()<256>();
    default:
      Unsupported("head_dim", head_dim);
  }
}

}  // namespace
}  // namespace attention

bool AttentionHeadDimSupported(int64_t head_dim) {
  return head_dim == 8 || head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 ||
         head_dim == 256;
}

void LaunchAttentionPrologue(const QkvPrologue& w, const AttentionDims& dims,
                             const DeviceBatch& batch, int64_t layer, DeviceKvPool kv, float* q,
                             float* k, float* v, cudaStream_t stream) {
  using namespace attention;
  if (batch.n_tokens == 0) return;
  PrologueParams p;
  p.w = w;
  p.q = q;
  p.k = k;
  p.v = v;
  p.positions = batch.positions;
  p.seq_of = batch.seq_of;
  p.block_tables = batch.block_tables;
  p.max_blocks = batch.max_blocks;
  p.pool = MakePoolRef(kv, dims, layer);
  p.dtype = kv.dtype;
  p.n_tokens = batch.n_tokens;
  p.n_heads = static_cast<int32_t>(dims.n_heads);
  p.n_kv_heads = static_cast<int32_t>(dims.n_kv_heads);
  p.eps = dims.norm_eps;
  switch (dims.head_dim) {
    case 8:
      return LaunchPrologueD<8>(p, stream);
    case 16:
      return LaunchPrologueD<16>(p, stream);
    case 32:
      return LaunchPrologueD<32>(p, stream);
    case 64:
      return LaunchPrologueD<64>(p, stream);
    case 128:
      return LaunchPrologueD<128>(p, stream);
    case 256:
      return LaunchPrologueD<256>(p, stream);
    default:
      Unsupported("head_dim", dims.head_dim);
  }
}

size_t PagedAttentionScratchBytes(const AttentionDims& dims, int64_t max_tokens,
                                  int64_t max_positions) {
  using namespace attention;
  if (max_positions <= 0 || dims.n_kv_heads <= 0) return 0;
  const int64_t context = Context(dims, max_positions - 1);
  int64_t most = 0;
  for (int64_t n = 1; n <= std::min(max_tokens, kDecodeMaxTokens); ++n) {
    const DecodePlan plan = PlanDecode(dims, n, context, INT64_MAX);
    if (plan.splits > 1) most = std::max(most, PartialBytes(dims, n, plan.splits));
  }
  return static_cast<size_t>(most);
}

void LaunchPagedAttention(const AttentionDims& dims, const DeviceBatch& batch, int64_t layer,
                          DeviceKvPool kv, const float* q, float* out, void* scratch,
                          size_t scratch_bytes, cudaStream_t stream) {
  using namespace attention;
  const int64_t T = batch.n_tokens;
  if (T == 0) return;
  const int64_t group = dims.n_heads / dims.n_kv_heads;
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(dims.head_dim));
  const PoolRef pool = MakePoolRef(kv, dims, layer);
  const int32_t window = static_cast<int32_t>(dims.sliding_window);

  if (T <= kDecodeMaxTokens || dims.head_dim < kPrefillMinHeadDim) {
    const int64_t context = Context(dims, batch.max_position);
    const DecodePlan plan =
        PlanDecode(dims, T, context, scratch == nullptr ? 0 : static_cast<int64_t>(scratch_bytes));
    DecodeParams p;
    p.q = q;
    p.out = out;
    p.part_acc = static_cast<float*>(scratch);
    p.part_ml =
        plan.splits > 1 ? p.part_acc + T * dims.n_heads * plan.splits * dims.head_dim : nullptr;
    p.positions = batch.positions;
    p.seq_of = batch.seq_of;
    p.block_tables = batch.block_tables;
    p.max_blocks = batch.max_blocks;
    p.pool = pool;
    p.n_heads = static_cast<int32_t>(dims.n_heads);
    p.group = static_cast<int32_t>(group);
    p.slices = static_cast<int32_t>(DecodeSlices(dims));
    p.window = window;
    p.chunk = static_cast<int32_t>(plan.chunk);
    p.splits = static_cast<int32_t>(plan.splits);
    p.scale_log2 = scale_log2;
    DispatchDimAndKv(dims.head_dim, kv.dtype, [&]<int D, typename Kv>() {
      LaunchDecodeD<D, Kv>(p, T, dims.n_kv_heads, stream);
    });
    return;
  }

  PrefillParams p;
  p.q = q;
  p.out = out;
  p.positions = batch.positions;
  p.seq_of = batch.seq_of;
  p.block_tables = batch.block_tables;
  p.max_blocks = batch.max_blocks;
  p.pool = pool;
  p.n_tokens = static_cast<int32_t>(T);
  p.n_heads = static_cast<int32_t>(dims.n_heads);
  p.group = static_cast<int32_t>(group);
  p.heads_per_slice = static_cast<int32_t>(std::min<int64_t>(group, kPrefillRows));
  p.slices = static_cast<int32_t>((group + p.heads_per_slice - 1) / p.heads_per_slice);
  p.tokens_per_tile = kPrefillRows / p.heads_per_slice;
  p.window = window;
  p.scale_log2 = scale_log2;
  DispatchDimAndKv(dims.head_dim, kv.dtype, [&]<int D, typename Kv>() {
    if constexpr (D >= kPrefillMinHeadDim) LaunchPrefillD<D, Kv>(p, dims.n_kv_heads, stream);
  });
}

}  // namespace moetier::cuda
