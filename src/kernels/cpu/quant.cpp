#include "kernels/cpu/quant.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace moetier::kernels {

namespace {

// round-half-even(v) clamped to [lo, hi], for |lo|, |hi| < 2^22. A NaN fails both comparisons
// and becomes `lo` instead of reaching an undefined float-to-int conversion. Adding and
// subtracting 1.5 * 2^23 leaves the nearest integer, ties to even, in the default rounding mode:
// exactly std::nearbyint's result, but inline and vectorizable (nearbyint is a libm call on
// baseline x86-64, and with it the quantizers ran at ~45 cycles an element).
int RoundClamp(float v, float lo, float hi) {
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
  return static_cast<int>((v + kRoundMagic) - kRoundMagic);
}

}  // namespace

void QuantizeRowQ8_0(const float* x, int64_t k, void* out) {
  auto* dst = static_cast<uint8_t*>(out);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, x += kQuantBlock) {
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    BlockQ8_0 blk;
    blk.d = F32ToF16(amax / 127.0f);
    const float d = F16ToF32(blk.d);
    // Quantize with the stored (rounded) scale so dequantization sees the same d; a division,
    // not a multiply by 1/d, so that exactly representable values d*q come back as q.
    for (int j = 0; j < kQuantBlock; ++j)
      blk.qs[j] = static_cast<int8_t>(d != 0.0f ? RoundClamp(x[j] / d, -127.0f, 127.0f) : 0);
    std::memcpy(dst + b * sizeof(BlockQ8_0), &blk, sizeof blk);
  }
}

void QuantizeRowQ4_0(const float* x, int64_t k, void* out) {
  auto* dst = static_cast<uint8_t*>(out);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, x += kQuantBlock) {
    float m = 0.0f;  // the element of largest magnitude, sign kept (first one on ties)
    for (int j = 0; j < kQuantBlock; ++j)
      if (std::fabs(x[j]) > std::fabs(m)) m = x[j];
    BlockQ4_0 blk;
    blk.d = F32ToF16(m / -8.0f);
    const float d = F16ToF32(blk.d);
    uint8_t code[kQuantBlock];
    for (int j = 0; j < kQuantBlock; ++j)
      code[j] = static_cast<uint8_t>((d != 0.0f ? RoundClamp(x[j] / d, -8.0f, 7.0f) : 0) + 8);
    for (int j = 0; j < 16; ++j) blk.qs[j] = static_cast<uint8_t>(code[j] | (code[j + 16] << 4));
    std::memcpy(dst + b * sizeof(BlockQ4_0), &blk, sizeof blk);
  }
}

void DequantizeRowQ8_0(const void* in, int64_t k, float* out) {
  const auto* src = static_cast<const uint8_t*>(in);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, out += kQuantBlock) {
    BlockQ8_0 blk;
    std::memcpy(&blk, src + b * sizeof(BlockQ8_0), sizeof blk);
    const float d = F16ToF32(blk.d);
    for (int j = 0; j < kQuantBlock; ++j) out[j] = d * static_cast<float>(blk.qs[j]);
  }
}

void DequantizeRowQ4_0(const void* in, int64_t k, float* out) {
  const auto* src = static_cast<const uint8_t*>(in);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, out += kQuantBlock) {
    BlockQ4_0 blk;
    std::memcpy(&blk, src + b * sizeof(BlockQ4_0), sizeof blk);
    const float d = F16ToF32(blk.d);
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>((blk.qs[j] & 15) - 8);
      out[j + 16] = d * static_cast<float>((blk.qs[j] >> 4) - 8);
    }
  }
}

}  // namespace moetier::kernels
