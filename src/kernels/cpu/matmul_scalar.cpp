// The scalar reference kernels: the definition every SIMD level is tested against. They
// accumulate in double, so each y is the exact dot of its (dequantized) operands up to one final
// rounding to float; speed is not a goal (MOETIER_CPU_ISA=scalar exists to check results).
// Built with the baseline flags, so it may use anything from core/.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/matmul_isa.h"
#include "kernels/cpu/quant.h"

namespace moetier::kernels::isa {

namespace {

int64_t TokenBytes(WFormat f, int64_t k) {
  return f == WFormat::kQ8_0 || f == WFormat::kQ4_0 ? QuantLayoutFor(k, 1).token_bytes : 0;
}

// The activation quantizer every ISA reproduces bit for bit: per 32-block, amax = max|x|,
// dx = amax / 127, q = round-half-even(clamp(x * (127 / amax), -127, 127)). A multiply by the
// reciprocal (not a division per element) because the SIMD versions must match it cheaply.
void Prepare(WFormat f, const float* x, int64_t n_tokens, int64_t k, uint8_t* out) {
  if (TokenBytes(f, k) == 0) return;
  const QuantLayout lay = QuantLayoutFor(k, 1);
  const int64_t nb = k / kBlock;
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = out + t * lay.token_bytes;
    std::memset(rec, 0, static_cast<size_t>(lay.token_bytes));  // padding must read as zero
    auto* qx = reinterpret_cast<int8_t*>(rec);
    auto* dx = reinterpret_cast<float*>(rec + lay.dx_offset);
    auto* bias = reinterpret_cast<int32_t*>(rec + lay.bias_offset);
    const float* xt = x + t * k;
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int64_t j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(xt[b * kBlock + j]));
      const float d = amax / 127.0f;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t j = 0; j < kBlock; ++j) {
        const float v = std::fmin(127.0f, std::fmax(-127.0f, xt[b * kBlock + j] * id));
        qx[b * kBlock + j] = static_cast<int8_t>(std::nearbyint(v));
      }
      for (int64_t l = 0; l < lay.lanes_per_block; ++l) {
        dx[b * lay.lanes_per_block + l] = d;
        bias[b * lay.lanes_per_block + l] = 0;  // the scalar kernel adds no offset to weight codes
      }
    }
  }
}

float WeightAt(WFormat f, const uint8_t* row, int64_t i) {
  uint16_t h;
  switch (f) {
    case WFormat::kF32: {
      float v;
      std::memcpy(&v, row + 4 * i, 4);
      return v;
    }
    case WFormat::kBF16:
      std::memcpy(&h, row + 2 * i, 2);
      return Bf16ToF32(h);
    case WFormat::kF16:
      std::memcpy(&h, row + 2 * i, 2);
      return F16ToF32(h);
    default:
      return 0.0f;
  }
}

// Integer dot of one weight block with 32 activation quants (exact in int32).
int32_t BlockDot(WFormat f, const uint8_t* blk, const int8_t* xq) {
  int32_t s = 0;
  if (f == WFormat::kQ8_0) {
    const auto* q = reinterpret_cast<const int8_t*>(blk + 2);
    for (int j = 0; j < 32; ++j) s += static_cast<int32_t>(q[j]) * xq[j];
  } else {
    const uint8_t* q = blk + 2;
    for (int j = 0; j < 16; ++j) {
      s += ((q[j] & 15) - 8) * static_cast<int32_t>(xq[j]);
      s += ((q[j] >> 4) - 8) * static_cast<int32_t>(xq[j + 16]);
    }
  }
  return s;
}

void DotRows(WFormat f, const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
             const Prepared& x, float* y, int64_t y_stride, float* scratch) {
  const int64_t k = x.k;
  if (f == WFormat::kQ8_0 || f == WFormat::kQ4_0) {
    const QuantLayout lay = QuantLayoutFor(k, 1);
    const int64_t nb = k / kBlock;
    const int64_t block_bytes = f == WFormat::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes;
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = w + r * row_bytes;
      for (int64_t t = 0; t < x.n_tokens; ++t) {
        const uint8_t* rec = x.data + t * x.token_bytes;
        const auto* qx = reinterpret_cast<const int8_t*>(rec);
        const auto* dx = reinterpret_cast<const float*>(rec + lay.dx_offset);
        double acc = 0.0;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = row + b * block_bytes;
          uint16_t h;
          std::memcpy(&h, blk, 2);
          const int32_t s = BlockDot(f, blk, qx + b * kBlock);
          acc += static_cast<double>(F16ToF32(h)) * dx[b * lay.lanes_per_block] * s;
        }
        y[t * y_stride + r] = static_cast<float>(acc);
      }
    }
    return;
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w + r * row_bytes;
    if (f == WFormat::kBF16C) {  // decoded once per row into scratch, then read as f32
      Bf16cRowToF32(row, k, scratch);
      row = reinterpret_cast<const uint8_t*>(scratch);
    }
    const WFormat rf = f == WFormat::kBF16C ? WFormat::kF32 : f;
    for (int64_t t = 0; t < x.n_tokens; ++t) {
      const float* xt = x.x + t * k;
      double acc = 0.0;
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(WeightAt(rf, row, i)) * xt[i];
      y[t * y_stride + r] = static_cast<float>(acc);
    }
  }
}

// The reference attention: plain loops, double sums (the SIMD kernels use float FMA chains).
void AttnScores(const float* q, int64_t n_q, int64_t q_stride, const float* keys,
                int64_t key_stride, int64_t n_keys, int64_t d, float scale, float* scores,
                int64_t score_stride) {
  for (int64_t g = 0; g < n_q; ++g)
    for (int64_t j = 0; j < n_keys; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < d; ++i)
        s += static_cast<double>(q[g * q_stride + i]) * keys[j * key_stride + i];
      scores[g * score_stride + j] = static_cast<float>(s) * scale;
    }
}

void AttnValues(const float* p, int64_t n_q, int64_t n_keys, int64_t p_stride, const float* values,
                int64_t value_stride, int64_t d, float* out, int64_t out_stride, bool accumulate) {
  for (int64_t g = 0; g < n_q; ++g)
    for (int64_t i = 0; i < d; ++i) {
      double s = accumulate ? static_cast<double>(out[g * out_stride + i]) : 0.0;
      for (int64_t j = 0; j < n_keys; ++j)
        s += static_cast<double>(p[g * p_stride + j]) * values[j * value_stride + i];
      out[g * out_stride + i] = static_cast<float>(s);
    }
}

const Kernels kScalar = {1,          0,          TokenBytes, Prepare, DotRows,
                         AttnScores, AttnValues, nullptr,    nullptr};

}  // namespace

const Kernels* ScalarKernels() {
  return &kScalar;
}

}  // namespace moetier::kernels::isa
