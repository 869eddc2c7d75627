// The prefill path of bf16 experts (expert_ffn.cu says how it works): per active expert a
// grouped GEMM on tensor cores (WMMA, bf16 operands, fp32 accumulation). Q8_0/Q4_0 experts take
// the int8 GEMM of expert_ffn_int8.cuh.
//
// Precision: an activation x is split into x_hi = bf16(x) and x_lo = bf16(x - x_hi), and each
// weight tile meets both (two products per step), so the activations keep about 16 bits of their
// mantissa instead of bf16's 8: the products are then as close to the CPU's fp32 arithmetic as
// the decode path's (the Hugging Face fixtures' 1e-3 tolerance holds; with x_hi alone it did
// not).
#pragma once

#include <mma.h>

#include "kernels/cuda/expert_ffn_common.cuh"

namespace moetier::cuda::expert_ffn {

// ---------------------------------------------------------------------------------------------
// Prefill path: WMMA grouped GEMM.

constexpr int kGemmM = 64;         // tokens a block
constexpr int kGemmN = 64;         // rows of each matrix a block
constexpr int kGemmK = 32;         // columns a step
constexpr int kGemmThreads = 128;  // 4 warps, 2 x 2, each 32 x 32 outputs of each matrix
// Shared-memory row pitch of the bf16 tiles: 80 bytes keeps every 16x16 fragment's start 32-byte
// aligned (WMMA's requirement) and rows off the same banks.
constexpr int kGemmLd = kGemmK + 8;
constexpr int kGemmLdC = kGemmN + 4;  // fp32 output staging pitch
__host__ __device__ constexpr int GemmSmemBytes(int n_mats) {
  const int tiles = (2 * kGemmM + n_mats * kGemmN) * kGemmLd * 2;  // A hi and lo, B
  const int outs = n_mats * kGemmM * kGemmLdC * 4;
  return tiles > outs ? tiles : outs;
}

struct GemmArgs {
  const int32_t* n_active;
  const int32_t* experts;
  const int32_t* begin;
  const int32_t* token_of;  // as DecodeArgs
  const ExpertPointers* table;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* act = nullptr;  // [*, cols] fp32
  float* out = nullptr;        // [n_assignments, rows]
};

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(FloatToBf16Bits(lo)) |
         (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
}

// The rest of x once bf16(x) is taken away, itself rounded to bf16.
__device__ __forceinline__ float Bf16Rest(float x) {
  return x - Bf16BitsToFloat(FloatToBf16Bits(x));
}

// hi[0..16) and lo[0..16) (bf16, 16-byte aligned shared memory) = the 16 activations of `row`
// from column c split in two (the header says why), zeros past n_cols or for a null row.
__device__ __forceinline__ void LoadActTile(const float* row, int64_t c, int64_t n_cols,
                                            uint16_t* hi, uint16_t* lo) {
  float f[16];
  if (row == nullptr) {
#pragma unroll
    for (int k = 0; k < 16; ++k) f[k] = 0.0f;
  } else if (c + 16 <= n_cols && (reinterpret_cast<uintptr_t>(row + c) & 15) == 0) {
    const auto* v = reinterpret_cast<const float4*>(row + c);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 q = v[k];
      f[4 * k] = q.x, f[4 * k + 1] = q.y, f[4 * k + 2] = q.z, f[4 * k + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; ++k) f[k] = c + k < n_cols ? row[c + k] : 0.0f;
  }
  uint32_t h[8], l[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    h[k] = PackBf16(f[2 * k], f[2 * k + 1]);
    l[k] = PackBf16(Bf16Rest(f[2 * k]), Bf16Rest(f[2 * k + 1]));
  }
  auto* oh = reinterpret_cast<uint4*>(hi);
  oh[0] = make_uint4(h[0], h[1], h[2], h[3]);
  oh[1] = make_uint4(h[4], h[5], h[6], h[7]);
  auto* ol = reinterpret_cast<uint4*>(lo);
  ol[0] = make_uint4(l[0], l[1], l[2], l[3]);
  ol[1] = make_uint4(l[4], l[5], l[6], l[7]);
}

// dst[0..16) (bf16, 16-byte aligned shared memory) = the bf16 weights [c, c + 16) of `row`;
// zeros past n_cols or for a null row.
__device__ __forceinline__ void LoadWeightTile(const unsigned char* row, int64_t c, int64_t n_cols,
                                               uint16_t* dst) {
  uint32_t w[8];
  const unsigned char* src = row != nullptr ? row + 2 * c : nullptr;
  if (src == nullptr) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = 0;
  } else if (c + 16 <= n_cols && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const auto* v = reinterpret_cast<const uint4*>(src);
    const uint4 a = v[0], b = v[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {  // rows of an even number of bf16: pairs are 4-byte aligned and whole
#pragma unroll
    for (int k = 0; k < 8; ++k)
      w[k] = c + 2 * k < n_cols ? reinterpret_cast<const uint32_t*>(src)[k] : 0u;
  }
  auto* out = reinterpret_cast<uint4*>(dst);
  out[0] = make_uint4(w[0], w[1], w[2], w[3]);
  out[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// As DecodeKernel, on tensor cores: the assignments [blockIdx.y * 64, +64) of active expert
// blockIdx.z against rows [blockIdx.x * 64, +64) of its matrices.
template <int kMats>
__global__ void __launch_bounds__(kGemmThreads) GemmKernel(GemmArgs p) {
  PdlWait();
  namespace wmma = nvcuda::wmma;
  GemmTile tile;
  if (!BlockTile(p, kGemmM, kGemmN, &tile)) return;
  const int32_t first = tile.first;
  const int n_assign = tile.n_assign, m0 = tile.m0;
  const int64_t n0 = tile.n0;
  const void* mat_ptr[2] = {kMats == 2 ? tile.e.gate : tile.e.down, tile.e.up};

  __shared__ __align__(128) unsigned char smem[GemmSmemBytes(kMats)];
  auto* sa = reinterpret_cast<uint16_t*>(smem);  // [2][kGemmM][kGemmLd] bf16: hi, then lo
  uint16_t* sb = sa + 2 * kGemmM * kGemmLd;      // [kMats][kGemmN][kGemmLd] bf16
  auto* sc = reinterpret_cast<float*>(smem);     // [kMats][kGemmM][kGemmLdC], after the k loop

  // Loads: thread -> one row of the A tile and of each B tile, 16 of the 32 columns.
  const int tid = static_cast<int>(threadIdx.x);
  const int ld_row = tid / 2, ld_col = (tid % 2) * 16;
  const float* a_row = nullptr;
  if (m0 + ld_row < n_assign) {
    const int32_t j = first + m0 + ld_row;
    a_row = p.act + (p.token_of != nullptr ? int64_t{p.token_of[j]} : int64_t{j}) * p.cols;
  }
  const unsigned char* b_row[kMats];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
    b_row[mat] = n0 + ld_row < p.rows ? static_cast<const unsigned char*>(mat_ptr[mat]) +
                                            (n0 + ld_row) * FmtBytes(Fmt::kBF16, p.cols)
                                      : nullptr;

  const int warp = tid / kWarp, wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMats][2][2];
#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) wmma::fill_fragment(acc[mat][i][jj], 0.0f);

  const auto* sa_bf = reinterpret_cast<const __nv_bfloat16*>(sa);
  const auto* sb_bf = reinterpret_cast<const __nv_bfloat16*>(sb);
  for (int64_t k0 = 0; k0 < p.cols; k0 += kGemmK) {
    LoadActTile(a_row, k0 + ld_col, p.cols, sa + ld_row * kGemmLd + ld_col,
                sa + (kGemmM + ld_row) * kGemmLd + ld_col);
#pragma unroll
    for (int mat = 0; mat < kMats; ++mat)
      LoadWeightTile(b_row[mat], k0 + ld_col, p.cols,
                     sb + (mat * kGemmN + ld_row) * kGemmLd + ld_col);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGemmK; kk += 16) {
      // fa[h][i]: rows wm * 32 + i * 16 of the activations' high (h = 0) and low (h = 1) part.
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(fa[h][i], sa_bf + (h * kGemmM + wm * 32 + i * 16) * kGemmLd + kk,
                                 kGemmLd);
#pragma unroll
      for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          // B = the weight rows, [n][k] in memory: a column-major k x n operand.
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, sb_bf + (mat * kGemmN + wn * 32 + jj * 16) * kGemmLd + kk,
                                 kGemmLd);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            wmma::mma_sync(acc[mat][i][jj], fa[1][i], fb, acc[mat][i][jj]);
            wmma::mma_sync(acc[mat][i][jj], fa[0][i], fb, acc[mat][i][jj]);
          }
        }
    }
    __syncthreads();  // the tiles are refilled (or reused as sc) next
  }

#pragma unroll
  for (int mat = 0; mat < kMats; ++mat)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        wmma::store_matrix_sync(
            sc + (mat * kGemmM + wm * 32 + i * 16) * kGemmLdC + wn * 32 + jj * 16, acc[mat][i][jj],
            kGemmLdC, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < kGemmM * kGemmN; idx += kGemmThreads) {
    const int i = idx / kGemmN, n = idx % kGemmN;
    if (m0 + i >= n_assign || n0 + n >= p.rows) continue;
    float v = sc[i * kGemmLdC + n];
    if constexpr (kMats == 2) v = Silu(v) * sc[(kGemmM + i) * kGemmLdC + n];
    p.out[static_cast<int64_t>(first + m0 + i) * p.rows + n0 + n] = v;
  }
}

}  // namespace moetier::cuda::expert_ffn
