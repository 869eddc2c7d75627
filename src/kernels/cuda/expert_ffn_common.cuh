// Pieces the expert kernels share (expert_ffn.cu, expert_ffn_decode.cuh,
// expert_ffn_prefill.cuh): the weight formats and their byte sizes, cp.async staging into
// shared memory, Q8_0/Q4_0 block loads and 8-bit dot products.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/expert_ffn.h"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda::expert_ffn {

enum class Fmt { kBF16, kQ8_0, kQ4_0 };

constexpr int kQBlock = 32;  // weights (and activation quants) per Q8_0/Q4_0 block
constexpr int kQ8Bytes = 34;
constexpr int kQ4Bytes = 18;

// Bytes of n_cols consecutive weights of a row (n_cols a multiple of 32 for Q8_0/Q4_0).
__host__ __device__ constexpr int64_t FmtBytes(Fmt f, int64_t n_cols) {
  return f == Fmt::kBF16 ? 2 * n_cols : n_cols / kQBlock * (f == Fmt::kQ8_0 ? kQ8Bytes : kQ4Bytes);
}

// ---------------------------------------------------------------------------------------------
// Shared-memory staging (cp.async, sm_80+).

__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src) {
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d),
               "l"(__cvta_generic_to_global(src))
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Copies bytes [src, src + n_bytes) to dst (16-byte aligned shared memory), thread `tid` of
// n_threads taking every n_threads-th piece: 16-byte cp.async where src is 16-byte aligned,
// 4-byte where it is 4-byte aligned, and the rest (a short tail, or all of a range that is only
// 2-byte aligned) by 2-byte loads and stores that complete at once. The asynchronous part lands
// by the caller's CpAsyncWait; either part is visible to other threads after a barrier.
// n_bytes even, src 2-byte aligned. Reads no byte outside the range.
__device__ __forceinline__ void CopyToShared(unsigned char* dst, const unsigned char* src,
                                             int n_bytes, int tid, int n_threads) {
  const auto addr = reinterpret_cast<uintptr_t>(src);
  int done = 0;
  if ((addr & 15) == 0) {
    done = n_bytes & ~15;
    for (int i = tid * 16; i < done; i += n_threads * 16) CpAsync16(dst + i, src + i);
  } else if ((addr & 3) == 0) {
    done = n_bytes & ~3;
    for (int i = tid * 4; i < done; i += n_threads * 4) CpAsync4(dst + i, src + i);
  }
  for (int i = done + tid * 2; i < n_bytes; i += n_threads * 2)
    *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
}

// ---------------------------------------------------------------------------------------------
// Weight decoding from shared memory.

// Eight words of a 2-byte aligned run of 32 bytes at p; reads up to 4 bytes past it (the
// staging slots have 16 bytes of padding).
__device__ __forceinline__ void LoadUnaligned32(const unsigned char* p, uint32_t w[8]) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto* words = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(addr & 3) * 8;  // 0 or 16
  uint32_t lo = words[0];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t hi = words[k + 1];
    w[k] = __funnelshift_r(lo, hi, shift);
    lo = hi;
  }
}

// One Q8_0/Q4_0 block at blk (2-byte aligned shared memory) as 32 8-bit weights packed four to
// a word in element order and its scale: Q8_0's signed quants, Q4_0's codes 0-15 (the dot then
// subtracts 8 x the sum of the activation quants: exact, and cheaper than unpacking to code - 8).
template <Fmt F>
__device__ __forceinline__ void LoadQuantBlock(const unsigned char* blk, int32_t q[8], float& d) {
  d = F16BitsToFloat(*reinterpret_cast<const uint16_t*>(blk));
  if constexpr (F == Fmt::kQ8_0) {
    uint32_t w[8];
    LoadUnaligned32(blk + 2, w);
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = static_cast<int32_t>(w[k]);
  } else {
    // 16 code bytes: byte i holds weight i (low nibble) and weight i + 16 (high nibble).
    const auto addr = reinterpret_cast<uintptr_t>(blk + 2);
    const auto* words = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
    const unsigned shift = static_cast<unsigned>(addr & 3) * 8;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t v = __funnelshift_r(words[k], words[k + 1], shift);
      q[k] = static_cast<int32_t>(v & 0x0F0F0F0Fu);
      q[k + 4] = static_cast<int32_t>((v >> 4) & 0x0F0F0F0Fu);
    }
  }
}

// A grouped-GEMM block's share: active expert blockIdx.z (its assignments [first, first +
// n_assign) of the routing's expert-major order), its assignments [m0, m0 + tile_m) and its
// matrices' rows from n0 = blockIdx.x * tile_n. Args: GemmArgs or Int8GemmArgs.
struct GemmTile {
  int32_t first = 0;
  int n_assign = 0;
  int m0 = 0;
  int64_t n0 = 0;
  ExpertPointers e;
};

// The block's tile, or false when it has none (an inactive expert, or past the expert's
// assignments): the whole block then returns before touching shared memory.
template <typename Args>
__device__ __forceinline__ bool BlockTile(const Args& p, int tile_m, int tile_n, GemmTile* t) {
  const int a = static_cast<int>(blockIdx.z);
  if (a >= *p.n_active) return false;
  t->first = p.begin[a];
  t->n_assign = p.begin[a + 1] - t->first;
  t->m0 = static_cast<int>(blockIdx.y) * tile_m;
  if (t->m0 >= t->n_assign) return false;
  t->n0 = static_cast<int64_t>(blockIdx.x) * tile_n;
  t->e = p.table[p.experts[a]];
  return true;
}

__device__ __forceinline__ float Silu(float g) {
  return g / (1.0f + expf(-g));
}

}  // namespace moetier::cuda::expert_ffn
