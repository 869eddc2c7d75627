// Pieces the attention kernels share (attention.cu, attention_decode.cuh,
// attention_prefill.cuh): the KV element formats loaded 16 bytes at a time, where a position's
// row lives in the paged pool, and the causal window of a token.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda::attention {

// KV element formats. kVec elements make one 16-byte load; Load converts them to float.
struct KvF32 {
  static constexpr int kVec = 4;
  __device__ __forceinline__ static void Load(const uint8_t* p, float* out) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  }
};

template <bool kBf16>
struct KvHalf16 {
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float ToFloat(uint32_t bits) {
    return kBf16 ? Bf16BitsToFloat(static_cast<uint16_t>(bits))
                 : F16BitsToFloat(static_cast<uint16_t>(bits));
  }
  __device__ __forceinline__ static void Load(const uint8_t* p, float* out) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = ToFloat(w[i] & 0xffffu);
      out[2 * i + 1] = ToFloat(w[i] >> 16);
    }
  }
};
using KvBf16 = KvHalf16<true>;
using KvF16 = KvHalf16<false>;

// The pool as the kernels address it (backend/kv_cache.h's layout): block b, layer l holds K
// [block_size, row] then V; `plane_bytes` = block_size * row * element size.
struct PoolRef {
  uint8_t* data = nullptr;
  int64_t n_layers = 0;
  int64_t layer = 0;
  int64_t plane_bytes = 0;  // one layer's K (or V) of one block
  int64_t row_bytes = 0;    // one position's K (or V) row: n_kv_heads * head_dim elements
  int32_t block_size = 0;
  int32_t elem_bytes = 0;
};

// Byte offset of position p's K row of the sequence with block table `table`; its V row is
// plane_bytes further.
__device__ __forceinline__ int64_t KeyRowOffset(const PoolRef& pool, const int32_t* table,
                                                int32_t p) {
  const int64_t block = table[p / pool.block_size];
  const int64_t slot = p % pool.block_size;
  return (block * pool.n_layers + pool.layer) * 2 * pool.plane_bytes + slot * pool.row_bytes;
}

// The first position token at `pos` attends to: 0, or the start of its sliding window.
__device__ __forceinline__ int32_t FirstKey(int32_t pos, int32_t window) {
  return window > 0 && pos >= window ? pos - window + 1 : 0;
}

// log2(e): scores are kept in the log2 domain so that the softmax uses exp2f.
inline constexpr float kLog2e = 1.4426950408889634f;

}  // namespace moetier::cuda::attention
