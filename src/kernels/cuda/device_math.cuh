// Device-side helpers the CUDA kernels share: weight element decoding (the formats of
// core/dtype.h and kernels/cpu/quant.h, byte for byte) and warp/block reductions. Math only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace moetier::cuda {

inline constexpr int kWarp = 32;

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ float F16BitsToFloat(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
// Round-to-nearest-even float -> bf16 bits (NaN stays NaN), as the CPU's conversion does.
__device__ __forceinline__ uint16_t FloatToBf16Bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint16_t FloatToF16Bits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}

// Sum over the 32 lanes of a warp; every lane gets the result. The order is fixed (a butterfly),
// so a given input always gives the same bits.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace moetier::cuda
