// Block-quantized weight formats, byte for byte GGUF's Q8_0 and Q4_0, so a GGUF tensor's bytes
// can be mapped and used as they are. Math only: no model knowledge.
//
// A row of k weights (k a multiple of 32) is k/32 blocks stored back to back, no padding:
//
//   Q8_0, 34 bytes:  [d: fp16, little-endian][qs: 32 x int8]        w[j] = d * qs[j]
//   Q4_0, 18 bytes:  [d: fp16, little-endian][qs: 16 x uint8]       w[j]      = d * ((qs[j] & 15) -
//   8)
//                                                                   w[j + 16] = d * ((qs[j] >> 4) -
//                                                                   8)
//
// (j < 16 for Q4_0: byte j holds weights j and j + 16, low nibble first.) Blocks are only
// 2-byte aligned (34 and 18 are even), so kernels use unaligned loads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moetier::kernels {

inline constexpr int64_t kQuantBlock = 32;  // weights per block, both formats

struct BlockQ8_0 {
  uint16_t d;     // fp16 scale bits
  int8_t qs[32];  // weights / d
};
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale bits
  uint8_t qs[16];  // 4-bit codes, offset by 8
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18,
              "GGUF block sizes: the formats must match byte for byte");

// Reference quantizers: x[k] (k a multiple of 32) to k/32 blocks at `out`
// (k/32 * sizeof(Block...) bytes, any 2-byte-aligned address).
//
// Q8_0: d = fp16(max|x| / 127); qs = round-half-even(x / d) clamped to [-127, 127]. The rounded
// fp16 d is the one used to quantize, so |x - d*qs| <= |d|/2 for every element.
// Q4_0: m = the element of largest magnitude (with its sign); d = fp16(m / -8);
// code = round-half-even(x / d) + 8 clamped to [0, 15]. m maps to code 0 exactly, so the 16 codes
// cover [-8|d|, 7|d|] on m's side; |x - w| <= |d|/2 except for elements near -m, which clamp to
// code 15: there |x| <= |m| and fp16 rounding leaves |m| <= 8|d| / (1 - 2^-11), so
// |x - w| <= |d| (8 / (1 - 2^-11) - 7), a little over |d| (by 2^-8 |d|).
// An all-zero block gets d = 0 (and codes 0, resp. 8). Non-finite inputs give unspecified (but
// defined) codes.
void QuantizeRowQ8_0(const float* x, int64_t k, void* out);
void QuantizeRowQ4_0(const float* x, int64_t k, void* out);

// Exact dequantization: out[k] = w (every w = fp16 * small integer is exact in float32).
void DequantizeRowQ8_0(const void* in, int64_t k, float* out);
void DequantizeRowQ4_0(const void* in, int64_t k, float* out);

}  // namespace moetier::kernels
