// The decode path's kernels for the smallest steps (expert_ffn.cu says when they run): one warp
// per output row (or two), with nothing shared between the warps of a block, so that one token's
// rows spread over every SM (DecodeKernel's 16-row tiles number ~100 at one token). Before its
// first weight a warp must find its expert (routing, then the table: a chain of dependent loads
// that costs about as much as the row itself); it does so once, all lanes at once.
//
// GemvGateUpKernel: h[j, r] = silu(gate_e[r] · a_j) * (up_e[r] · a_j), a warp per (assignment
// j, kGemvGateUpRows rows r). GemvDownKernel: y[j, r] = down_e[r] · h_j per assignment, or,
// summing, out[t, r] = Σ over token t's assignments in assign_of order of weight_of[j] * (down_e[r]
// · h_j) (+ partial): the down launch and the routed sum in one.
//
// Every dot is DecodeKernel's, operation for operation: a lane takes the 8-weight units (bf16)
// or 32-blocks (Q8_0/Q4_0) lane, lane + 32, lane + 64, ... in that order with the same fp32 FMAs
// and integer block dots, then the same WarpSum; the sum folds a token's products in the same
// order as RoutedSumKernel. So the results are bit for bit those of the tiled kernels
// (ExpertFfnDecode.TokenAloneEqualsTokenInBatch holds them to it).
//
// bf16 rows are read straight into registers, 16 bytes a lane a load (2 bytes where a row is not
// 16-byte aligned), kGemvLoads of them in flight; Q8_0/Q4_0 rows are staged by
// cp.async into the warp's own shared memory, all rows of a chunk at once.
#pragma once

#include "kernels/cuda/expert_ffn_common.cuh"

namespace moetier::cuda::expert_ffn {

constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * kWarp;
// bf16: 16-byte loads a lane keeps in flight, over its rows: 8 keeps gate+up at two blocks an SM
// (128 registers).
constexpr int kGemvLoads = 8;
// Rows a summing down warp dots at once (of its token's top_k): their loads in flight together.
constexpr int kGemvDownRows = 4;
// Rows of one assignment a gate+up warp takes, one after another: its expert is found once. On the
// H200 (8 experts of 768 rows, one token) 2 beat 1, 3 and 4 by 3-12 % for bf16, Q8_0 and Q4_0.
constexpr int kGemvGateUpRows = 2;

// Columns a quantized row is staged in at a time, and a staged row's slot (16 bytes of padding:
// LoadUnaligned32 reads a word past a block).
__host__ __device__ constexpr int GemvChunkCols(Fmt f) {
  return f == Fmt::kQ8_0 ? 1024 : 2048;
}
__host__ __device__ constexpr int GemvSlotBytes(Fmt f) {
  return static_cast<int>(FmtBytes(f, GemvChunkCols(f))) + 16;
}
// A block's shared memory: each warp's slots for kRows rows (none for bf16).
__host__ __device__ constexpr int GemvSmemBytes(Fmt f, int rows) {
  return f == Fmt::kBF16 ? 0 : kGemvWarps * rows * GemvSlotBytes(f);
}

struct GemvArgs {
  DeviceRouting r;
  const ExpertPointers* table = nullptr;
  int64_t d_model = 0;
  int64_t width = 0;
  const float* x = nullptr;  // [n_tokens, d_model]
  const int8_t* x_q = nullptr;
  const float* x_d = nullptr;
  int64_t x_q_stride = 0;
  float* h = nullptr;  // [n_assignments, width]
  const int8_t* h_q = nullptr;
  const float* h_d = nullptr;
  int64_t h_q_stride = 0;
  float* y = nullptr;              // down, not summing: [n_assignments, d_model]
  const float* partial = nullptr;  // summing: added to each sum when not null
  float* out = nullptr;            // summing: [n_tokens, d_model]
  int32_t* active_record = nullptr;
  // Whether the launch finds its rows and prefetches them to L2 before PdlWait: allowed when the
  // routing and the table were written two or more launches back (launch.cuh), as for down
  // (after gate+up) and for gate+up after x's quantizing.
  bool rows_before_wait = false;
};

// The active expert of expert-major assignment j: the a with begin[a] <= j < begin[a + 1].
__device__ __forceinline__ int ActiveOf(const int32_t* begin, int n_active, int32_t j) {
  int lo = 0, hi = n_active - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (begin[mid] <= j)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The same for a warp whose 32 lanes call it together (j may differ between lanes), in one round
// of loads instead of a binary search's chain: lane l reads begin[l], and a is the number of the
// first min(n_active, 32) entries <= j, less one. A step on these kernels has few active experts
// (UsesGemv); beyond 32 it falls back to the search.
__device__ __forceinline__ int WarpActiveOf(const DeviceRouting& r, int32_t j, int lane) {
  const int n_active = *r.n_active;
  const int32_t mine = lane <= r.n_experts ? r.begin[lane] : 0;  // begin has n_experts + 1
  if (n_active > kWarp) return ActiveOf(r.begin, n_active, j);
  int a = -1;
  for (int l = 0; l < n_active; ++l) a += __shfl_sync(0xffffffffu, mine, l) <= j ? 1 : 0;
  return a;
}

// One row's operand of a dot: its weights and the activations it meets.
struct GemvRow {
  const unsigned char* w = nullptr;
  const float* act = nullptr;     // bf16 weights
  const int8_t* act_q = nullptr;  // Q8_0/Q4_0
  const float* act_d = nullptr;
};

// The 16 bytes of unit u (8 bf16 weights) of a row; 2-byte loads where the row is not 16-byte
// aligned (the same values either way).
__device__ __forceinline__ uint4 LoadBf16Unit(const unsigned char* row, int64_t u, bool aligned) {
  if (aligned) return __ldg(reinterpret_cast<const uint4*>(row) + u);
  const auto* h = reinterpret_cast<const uint16_t*>(row) + u * 8;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<uint32_t>(__ldg(h + 2 * k)) |
           (static_cast<uint32_t>(__ldg(h + 2 * k + 1)) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// acc[i] = row i's weights · its activations over `cols` (a multiple of 8) columns, this lane's
// share: units lane, lane + 32, ... ascending, fp32 FMAs in column order (DecodeKernel's DotBf16).
template <int kRows>
__device__ __forceinline__ void Bf16RowDots(const GemvRow (&rows)[kRows], int n_rows, int64_t cols,
                                            int lane, float (&acc)[kRows]) {
  bool aligned[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    acc[i] = 0.0f;
    aligned[i] = (reinterpret_cast<uintptr_t>(rows[i].w) & 15) == 0;
  }
  constexpr int kUnroll = kGemvLoads / kRows > 0 ? kGemvLoads / kRows : 1;
  const int64_t n_units = cols / 8;
  for (int64_t u0 = lane; u0 < n_units; u0 += kWarp * kUnroll) {
    uint4 raw[kUnroll][kRows];
#pragma unroll
    for (int s = 0; s < kUnroll; ++s)
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        if (i < n_rows && u0 + s * kWarp < n_units)
          raw[s][i] = LoadBf16Unit(rows[i].w, u0 + s * kWarp, aligned[i]);
#pragma unroll
    for (int s = 0; s < kUnroll; ++s) {
      const int64_t u = u0 + s * kWarp;
      if (u >= n_units) break;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (i >= n_rows) break;
        const uint32_t words[4] = {raw[s][i].x, raw[s][i].y, raw[s][i].z, raw[s][i].w};
        const auto* xs = reinterpret_cast<const float4*>(rows[i].act + u * 8);
        const float4 x0 = __ldg(xs), x1 = __ldg(xs + 1);
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          acc[i] =
              fmaf(Bf16BitsToFloat(static_cast<uint16_t>(words[k] & 0xFFFFu)), x[2 * k], acc[i]);
          acc[i] =
              fmaf(Bf16BitsToFloat(static_cast<uint16_t>(words[k] >> 16)), x[2 * k + 1], acc[i]);
        }
      }
    }
  }
}

// The same for Q8_0/Q4_0 rows of `cols` columns: chunk by chunk, every row's chunk staged into
// the warp's slots (`slots`, kRows of GemvSlotBytes) by cp.async together; a lane takes blocks
// lane, lane + 32, ... with DecodeKernel's DotQuant arithmetic.
template <Fmt F, int kRows>
__device__ __forceinline__ void QuantRowDots(const GemvRow (&rows)[kRows], int n_rows, int64_t cols,
                                             unsigned char* slots, int lane, float (&acc)[kRows]) {
  constexpr int kBlockBytes = F == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes;
#pragma unroll
  for (int i = 0; i < kRows; ++i) acc[i] = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += GemvChunkCols(F)) {
    const int n_cols =
        static_cast<int>(cols - c0 < GemvChunkCols(F) ? cols - c0 : GemvChunkCols(F));
    __syncwarp();  // the previous chunk's reads of the slots are done
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (i < n_rows)
        CopyToShared(slots + i * GemvSlotBytes(F), rows[i].w + FmtBytes(F, c0),
                     static_cast<int>(FmtBytes(F, n_cols)), lane, kWarp);
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncwarp();
    const int n_blocks = n_cols / kQBlock;
    for (int b = lane; b < n_blocks; b += kWarp) {
      const int64_t gb = c0 / kQBlock + b;  // the block's index in the row
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (i >= n_rows) break;
        int32_t q[8];
        float d;
        LoadQuantBlock<F>(slots + i * GemvSlotBytes(F) + b * kBlockBytes, q, d);
        const auto* xs = reinterpret_cast<const int4*>(rows[i].act_q + gb * kQBlock);
        const int4 xa = __ldg(xs), xb = __ldg(xs + 1);
        const float dx = __ldg(rows[i].act_d + gb);
        int32_t offset = 0;  // Q4_0: 8 x the sum of the 32 activation quants
        if constexpr (F == Fmt::kQ4_0) {
          constexpr int32_t kOnes[8] = {0x01010101, 0x01010101, 0x01010101, 0x01010101,
                                        0x01010101, 0x01010101, 0x01010101, 0x01010101};
          offset = 8 * Dot32(kOnes, xa, xb);
        }
        const int32_t dot = Dot32(q, xa, xb) - offset;
        acc[i] = fmaf(static_cast<float>(dot), d * dx, acc[i]);
      }
    }
  }
}

template <Fmt F, int kRows>
__device__ __forceinline__ void RowDots(const GemvRow (&rows)[kRows], int n_rows, int64_t cols,
                                        unsigned char* slots, int lane, float (&acc)[kRows]) {
  if constexpr (F == Fmt::kBF16) {
    Bf16RowDots<kRows>(rows, n_rows, cols, lane, acc);
  } else {
    QuantRowDots<F, kRows>(rows, n_rows, cols, slots, lane, acc);
  }
}

// This warp's global index over the launch, and its shared-memory slots (kRows of them).
template <Fmt F, int kRows>
__device__ __forceinline__ int64_t GemvWarp(unsigned char* smem, unsigned char** slots) {
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  *slots = smem + warp * kRows * (F == Fmt::kBF16 ? 0 : GemvSlotBytes(F));
  return static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
}

// A warp per (assignment j, kGemvGateUpRows consecutive rows r): h[j, r] = silu(gate · a) * (up ·
// a), a = the activations of j's token (quantized for Q8_0/Q4_0). The warp finds j's expert once
// for its rows, before PdlWait with rows_before_wait (its rows then prefetched to L2).
template <Fmt F>
__global__ void __launch_bounds__(kGemvThreads) GemvGateUpKernel(GemvArgs p) {
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  unsigned char* slots = nullptr;
  const int64_t g = GemvWarp<F, 2>(gemv_smem, &slots);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps_per_j = (p.width + kGemvGateUpRows - 1) / kGemvGateUpRows;
  const int64_t j = g / warps_per_j, r0 = g % warps_per_j * kGemvGateUpRows;
  if (j >= p.r.n_tokens * p.r.top_k) return;  // whole warps, touching no memory; no barrier below
  if (!p.rows_before_wait) PdlWait();
  const ExpertPointers e = p.table[p.r.experts[WarpActiveOf(p.r, static_cast<int32_t>(j), lane)]];
  const int64_t t = p.r.token_of[j];
  const int64_t row_bytes = FmtBytes(F, p.d_model);
  const int64_t r1 = r0 + kGemvGateUpRows < p.width ? r0 + kGemvGateUpRows : p.width;
  if (p.rows_before_wait) {
    PrefetchL2(static_cast<const unsigned char*>(e.gate) + r0 * row_bytes, (r1 - r0) * row_bytes,
               lane);
    PrefetchL2(static_cast<const unsigned char*>(e.up) + r0 * row_bytes, (r1 - r0) * row_bytes,
               lane);
    PdlWait();
  }
  GemvRow rows[2];
  for (GemvRow& row : rows) {
    row.act = p.x + t * p.d_model;
    row.act_q = p.x_q + t * p.x_q_stride;
    row.act_d = p.x_d + t * (p.d_model / kQBlock);
  }
  for (int64_t r = r0; r < r1; ++r) {
    rows[0].w = static_cast<const unsigned char*>(e.gate) + r * row_bytes;
    rows[1].w = static_cast<const unsigned char*>(e.up) + r * row_bytes;
    float acc[2];
    RowDots<F, 2>(rows, 2, p.d_model, slots, lane, acc);
    const float v = Silu(WarpSum(acc[0])) * WarpSum(acc[1]);
    if (lane == 0) p.h[j * p.width + r] = v;
  }
}

// The down row r of assignment j's expert, dotted with h_j (quantized for Q8_0/Q4_0).
template <Fmt F>
__device__ __forceinline__ GemvRow DownRow(const GemvArgs& p, const void* down, int32_t j,
                                           int64_t r) {
  GemvRow row;
  row.w = static_cast<const unsigned char*>(down) + r * FmtBytes(F, p.width);
  row.act = p.h + static_cast<int64_t>(j) * p.width;
  row.act_q = p.h_q + static_cast<int64_t>(j) * p.h_q_stride;
  row.act_d = p.h_d + static_cast<int64_t>(j) * (p.width / kQBlock);
  return row;
}

// kSum: a warp per (token t, row r), out[t, r] = Σ_k weight_of[j_k] * (down · h_{j_k}) over
// j_k = assign_of[t, k] in order, + partial[t, r] when given; and *active_record = *n_active.
// Lane k < top_k (<= 32, UsesGemv) finds assignment j_k's expert and weight, all k at once, and
// prefetches its row to L2. Otherwise a warp per (assignment j, row r): y[j, r] = down · h_j.
// With rows_before_wait both find (and prefetch) their rows before PdlWait; h is read after it.
template <Fmt F, bool kSum>
__global__ void __launch_bounds__(kGemvThreads) GemvDownKernel(GemvArgs p) {
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  constexpr int kRows = kSum ? kGemvDownRows : 1;
  unsigned char* slots = nullptr;
  const int64_t g = GemvWarp<F, kRows>(gemv_smem, &slots);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t i = g / p.d_model, r = g % p.d_model;
  const int64_t row_bytes = FmtBytes(F, p.width);
  if constexpr (!kSum) {
    if (i >= p.r.n_tokens * p.r.top_k) return;  // whole warps, touching no memory; no barrier
    const auto j = static_cast<int32_t>(i);
    if (!p.rows_before_wait) PdlWait();
    const void* down = p.table[p.r.experts[WarpActiveOf(p.r, j, lane)]].down;
    GemvRow rows[1] = {DownRow<F>(p, down, j, r)};
    if (p.rows_before_wait) {
      PrefetchL2(rows[0].w, row_bytes, lane);
      PdlWait();
    }
    float acc[1];
    RowDots<F, 1>(rows, 1, p.width, slots, lane, acc);
    const float v = WarpSum(acc[0]);
    if (lane == 0) p.y[i * p.d_model + r] = v;
  } else {
    if (i >= p.r.n_tokens) return;  // whole warps, touching no memory; no barrier below
    if (!p.rows_before_wait) PdlWait();
    const int top_k = static_cast<int>(p.r.top_k);
    const int32_t my_j = lane < top_k ? p.r.assign_of[i * top_k + lane] : 0;
    const int my_a = WarpActiveOf(p.r, my_j, lane);
    const void* my_down = lane < top_k ? p.table[p.r.experts[my_a]].down : nullptr;
    const float my_weight = lane < top_k ? p.r.weight_of[my_j] : 0.0f;
    if (p.rows_before_wait) {
      if (lane < top_k)
        PrefetchL2(static_cast<const unsigned char*>(my_down) + r * row_bytes, row_bytes, 0, 1);
      PdlWait();
    }
    if (g == 0 && lane == 0 && p.active_record != nullptr) *p.active_record = *p.r.n_active;
    float sum = 0.0f;
    for (int k0 = 0; k0 < top_k; k0 += kRows) {
      const int n = top_k - k0 < kRows ? top_k - k0 : kRows;
      GemvRow rows[kRows];
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const auto down = reinterpret_cast<const void*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_down), k0 + k));
        const int32_t j = __shfl_sync(0xffffffffu, my_j, k0 + k);
        if (k < n) rows[k] = DownRow<F>(p, down, j, r);
      }
      float acc[kRows];
      RowDots<F, kRows>(rows, n, p.width, slots, lane, acc);
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const float w = __shfl_sync(0xffffffffu, my_weight, k0 + k);
        if (k < n) sum = fmaf(w, WarpSum(acc[k]), sum);
      }
    }
    if (lane == 0)
      p.out[i * p.d_model + r] = p.partial != nullptr ? sum + p.partial[i * p.d_model + r] : sum;
  }
}

}  // namespace moetier::cuda::expert_ffn
