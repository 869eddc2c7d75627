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

// Larger float, larger key (finite values; the logits' order in top_k.cu and draw.cu).
__device__ __forceinline__ uint32_t OrderKey(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float FromOrderKey(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? (key & 0x7fffffffu) : ~key);
}
// Neither NaN nor an infinity.
__device__ __forceinline__ bool Finite(float v) {
  constexpr uint32_t kExponent = 0x7f800000u;  // all ones: inf or NaN
  return (__float_as_uint(v) & kExponent) != kExponent;
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

// One lane's value of a warp's 32-value block quantized as the CPU's kernels do
// (kernels/cpu/matmul_scalar.cpp): amax = max |v| over the warp, *scale = amax / 127, and the
// code round-half-even(clamp(v * (127 / amax), -127, 127)), 0 when amax is 0. IEEE division and
// one multiply, no contraction: the codes match the CPU's bit for bit.
__device__ __forceinline__ int8_t QuantizeLane(float v, float* scale) {
  const float amax = WarpMax(fabsf(v));
  const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
  *scale = amax / 127.0f;
  return static_cast<int8_t>(__float2int_rn(fminf(127.0f, fmaxf(-127.0f, v * inv))));
}

// Exact integer dot of 32 weight codes (4 a word) with 32 activation quants (xa: quants 0-15,
// xb: 16-31), in a fixed order.
__device__ __forceinline__ int32_t Dot32(const int32_t q[8], int4 xa, int4 xb) {
  int32_t s = __dp4a(q[0], xa.x, 0);
  s = __dp4a(q[1], xa.y, s);
  s = __dp4a(q[2], xa.z, s);
  s = __dp4a(q[3], xa.w, s);
  s = __dp4a(q[4], xb.x, s);
  s = __dp4a(q[5], xb.y, s);
  s = __dp4a(q[6], xb.z, s);
  return __dp4a(q[7], xb.w, s);
}

}  // namespace moetier::cuda
