// AVX2 + FMA + F16C kernels (256-bit), included by matmul_avx2.cpp and, with
// MOETIER_KERNEL_AVXVNNI defined, by matmul_avxvnni.cpp, each compiled with its ISA's -m flags.
// Everything here has internal linkage (see the ODR note in matmul_isa.h).
//
// Shapes: a tile is R weight rows x C tokens; each (row, token) pair owns one 8-lane float32
// accumulator, updated once per 8 elements (float formats) or per 32-block (quantized), in k
// order, then summed across lanes in a fixed tree. R and C only change which pairs share loads,
// never an element's arithmetic, so results do not depend on the row split or token count.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul_isa.h"

namespace moetier::kernels::isa {
namespace {

#if defined(MOETIER_KERNEL_AVXVNNI)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------------------------
// Float formats, fp32 arithmetic.

template <WFormat F>
constexpr int64_t ElemBytes() {
  return F == WFormat::kF32 ? 4 : 2;
}

// 8 weights starting at element i of `row`, as float32 (bf16 and f16 convert exactly).
template <WFormat F>
inline __m256 Load8(const uint8_t* row, int64_t i) {
  if constexpr (F == WFormat::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (F == WFormat::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  }
}

// The last n < 8 weights from element i, zero padded (a copy: never reads past the row).
template <WFormat F>
inline __m256 LoadTail(const uint8_t* row, int64_t i, int64_t n) {
  alignas(32) uint8_t buf[32] = {};
  std::memcpy(buf, row + ElemBytes<F>() * i, static_cast<size_t>(n * ElemBytes<F>()));
  return Load8<F>(buf, 0);
}

inline __m256 LoadTailX(const float* x, int64_t n) {
  alignas(32) float buf[8] = {};
  std::memcpy(buf, x, static_cast<size_t>(n) * sizeof(float));
  return _mm256_load_ps(buf);
}

template <WFormat F, int R, int C>
void FloatTile(const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t y_stride) {
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = Load8<F>(w + r * row_bytes, i);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m256 xv = _mm256_loadu_ps(x + c * k + i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  if (i < k) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadTail<F>(w + r * row_bytes, i, k - i);
    for (int c = 0; c < C; ++c) {
      const __m256 xv = LoadTailX(x + c * k + i, k - i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * y_stride + r] = HSum(acc[r][c]);
}

// Converts rows to float32 in `out` (row stride `stride` floats): exact, so a tile over the
// converted rows does the very same arithmetic as one over the originals.
template <WFormat F>
void ConvertRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                 int64_t stride) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* o = out + r * stride;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(o + i, Load8<F>(row, i));
    if (i < k) {
      alignas(32) float buf[8];
      _mm256_store_ps(buf, LoadTail<F>(row, i, k - i));
      std::memcpy(o + i, buf, static_cast<size_t>(k - i) * sizeof(float));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantized formats: int8 dots per 32-block, scaled per block in float32.

struct QuantRow {  // one weight row's block at index b, ready for the int8 dot
  __m256i q;       // Q8_0: the int8 codes (kVnni: + 128, as uint8); Q4_0: the 4-bit codes 0..15
  __m256i absq;    // Q8_0 without VNNI: |codes| (vpmaddubsw needs one unsigned operand)
  __m256 d;        // the block's fp16 scale, broadcast
};

template <WFormat F>
inline QuantRow LoadQuant(const uint8_t* blk) {
  QuantRow qr;
  uint16_t h;
  std::memcpy(&h, blk, 2);
  qr.d = _mm256_set1_ps(_cvtsh_ss(h));
  if constexpr (F == WFormat::kQ8_0) {
    qr.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    if constexpr (kVnni) {
      qr.q = _mm256_xor_si256(qr.q, _mm256_set1_epi8(static_cast<char>(0x80)));  // + 128
      qr.absq = qr.q;
    } else {
      qr.absq = _mm256_abs_epi8(qr.q);
    }
  } else {
    // [qs | qs] -> low 128 bits keep the low nibbles (weights 0..15), high 128 bits the high
    // nibbles (weights 16..31): the block's natural order.
    const __m256i v =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    const __m256i both = _mm256_blend_epi32(v, _mm256_srli_epi16(v, 4), 0xF0);
    qr.q = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
    qr.absq = qr.q;
  }
  return qr;
}

// int32 lanes (each the dot of 4 consecutive elements) of a weight block with activation quants
// xq, plus bias (the prepared -offset * sum correction).
template <WFormat F>
inline __m256i BlockDot(const QuantRow& w, __m256i xq, __m256i bias) {
#if defined(MOETIER_KERNEL_AVXVNNI)
  (void)F;
  return _mm256_dpbusd_avx_epi32(bias, w.q, xq);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (F == WFormat::kQ8_0) {
    // |w| * (x * sign(w)): pairs stay within int16 (2 * 128 * 127 < 32768).
    const __m256i p = _mm256_maddubs_epi16(w.absq, _mm256_sign_epi8(xq, w.q));
    (void)bias;  // offset 0: no correction
    return _mm256_madd_epi16(p, ones);
  } else {
    // codes 0..15 * x: pairs within int16 (2 * 15 * 127).
    const __m256i p = _mm256_maddubs_epi16(w.q, xq);
    return _mm256_add_epi32(_mm256_madd_epi16(p, ones), bias);
  }
#endif
}

template <WFormat F>
constexpr int64_t QBlockBytes() {
  return F == WFormat::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes;
}

template <WFormat F, int R, int C>
void QuantTile(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
               int64_t k, float* y, int64_t y_stride) {
  const QuantLayout lay = QuantLayoutFor(k);
  const int64_t nb = k / kBlock;
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    QuantRow wr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wr[r] = LoadQuant<F>(w + r * row_bytes + b * QBlockBytes<F>());
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* rec = xrec + c * token_bytes;
      const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + b * kBlock));
      const __m256 dx = _mm256_load_ps(reinterpret_cast<const float*>(rec + lay.dx_offset) +
                                       b * kLanesPerBlock);
      const __m256i bias = _mm256_load_si256(
          reinterpret_cast<const __m256i*>(rec + lay.bias_offset) + b);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_cvtepi32_ps(BlockDot<F>(wr[r], xq, bias));
        acc[r][c] = _mm256_fmadd_ps(s, _mm256_mul_ps(wr[r].d, dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * y_stride + r] = HSum(acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// Row/token blocking. RMAX x CMAX is the largest tile; remainders use smaller instantiations.

#define MOETIER_TILE_SWITCH(FN, R, C, ...)                   \
  switch ((R) * 8 + (C)) {                                   \
    case 1 * 8 + 1: FN<1, 1>(__VA_ARGS__); break;           \
    case 1 * 8 + 2: FN<1, 2>(__VA_ARGS__); break;           \
    case 2 * 8 + 1: FN<2, 1>(__VA_ARGS__); break;           \
    case 2 * 8 + 2: FN<2, 2>(__VA_ARGS__); break;           \
    case 3 * 8 + 1: FN<3, 1>(__VA_ARGS__); break;           \
    case 3 * 8 + 2: FN<3, 2>(__VA_ARGS__); break;           \
    case 4 * 8 + 1: FN<4, 1>(__VA_ARGS__); break;           \
    case 4 * 8 + 2: FN<4, 2>(__VA_ARGS__); break;           \
    default: break;                                          \
  }

template <WFormat F>
struct FloatTiles {
  template <int R, int C>
  static void Run(const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
                  int64_t y_stride) {
    FloatTile<F, R, C>(w, row_bytes, x, k, y, y_stride);
  }
};

template <WFormat F>
void FloatRows(const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
               const Prepared& x, float* y, int64_t y_stride, float* scratch) {
  constexpr int64_t kRows = 4, kTokens = 2;
  const int64_t k = x.k;
  // With more tokens than one tile holds, convert each group of rows once (exactly) and reuse
  // it for every token tile; with fewer, convert in registers.
  const bool convert = F != WFormat::kF32 && x.n_tokens > kTokens;
  const int64_t stride = RoundUp(k, 64);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int64_t nr = Min(kRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTokens) {
      const int64_t nt = Min(kTokens, x.n_tokens - t0);
      float* yt = y + t0 * y_stride + r0;
      const float* xt = x.x + t0 * k;
      if (convert) {
        if (t0 == 0) ConvertRows<F>(w + r0 * row_bytes, row_bytes, nr, k, scratch, stride);
        const auto* cw = reinterpret_cast<const uint8_t*>(scratch);
        MOETIER_TILE_SWITCH(FloatTiles<WFormat::kF32>::template Run, nr, nt, cw, stride * 4, xt,
                            k, yt, y_stride)
      } else {
        MOETIER_TILE_SWITCH(FloatTiles<F>::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                            xt, k, yt, y_stride)
      }
    }
  }
}

template <WFormat F>
struct QuantTiles {
  template <int R, int C>
  static void Run(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
                  int64_t k, float* y, int64_t y_stride) {
    QuantTile<F, R, C>(w, row_bytes, xrec, token_bytes, k, y, y_stride);
  }
};

template <WFormat F>
void QuantRows(const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
               const Prepared& x, float* y, int64_t y_stride) {
  // 16 ymm registers: 4 rows x 1 token for decode; 2 x 2 when tokens can share the unpacking.
  const int64_t kRows = x.n_tokens == 1 ? 4 : 2, kTokens = x.n_tokens == 1 ? 1 : 2;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int64_t nr = Min(kRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTokens) {
      const int64_t nt = Min(kTokens, x.n_tokens - t0);
      MOETIER_TILE_SWITCH(QuantTiles<F>::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                          x.data + t0 * x.token_bytes, x.token_bytes, x.k,
                          y + t0 * y_stride + r0, y_stride)
    }
  }
}

#undef MOETIER_TILE_SWITCH

// ---------------------------------------------------------------------------------------------
// Activation quantization, bit-identical to the scalar reference (matmul_scalar.cpp).

int64_t TokenBytes(WFormat f, int64_t k) {
  return f == WFormat::kQ8_0 || f == WFormat::kQ4_0 ? QuantLayoutFor(k).token_bytes : 0;
}

int32_t QuantOffset(WFormat f) {
  if (f == WFormat::kQ4_0) return 8;
  return kVnni ? 128 : 0;
}

void Prepare(WFormat f, const float* x, int64_t n_tokens, int64_t k, uint8_t* out) {
  if (TokenBytes(f, k) == 0) return;
  const QuantLayout lay = QuantLayoutFor(k);
  const int64_t nb = k / kBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i neg_offset = _mm256_set1_epi32(-QuantOffset(f));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = out + t * lay.token_bytes;
    std::memset(rec, 0, static_cast<size_t>(lay.token_bytes));
    const float* xt = x + t * k;
    for (int64_t b = 0; b < nb; ++b) {
      __m256 v[4];
      __m256 m = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        v[j] = _mm256_loadu_ps(xt + b * kBlock + 8 * j);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 0x55));
      const float amax = _mm_cvtss_f32(m4);
      const float d = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      __m256i q[4];
      for (int j = 0; j < 4; ++j)
        q[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[j], id), lo), hi));
      // int32 -> int8 (values already in range, so saturation never bites), natural order.
      const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);
      const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
      const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), order);
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + b * kBlock), q8);
      _mm256_store_ps(reinterpret_cast<float*>(rec + lay.dx_offset) + b * kLanesPerBlock,
                      _mm256_set1_ps(d));
      const __m256i sum4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8),
                                             _mm256_set1_epi16(1));
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + lay.bias_offset) + b,
                         _mm256_mullo_epi32(sum4, neg_offset));
    }
  }
}

void DotRows(WFormat f, const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
             const Prepared& x, float* y, int64_t y_stride, float* scratch) {
  switch (f) {
    case WFormat::kF32:
      return FloatRows<WFormat::kF32>(w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
    case WFormat::kBF16:
      return FloatRows<WFormat::kBF16>(w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
    case WFormat::kF16:
      return FloatRows<WFormat::kF16>(w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
    case WFormat::kQ8_0:
      return QuantRows<WFormat::kQ8_0>(w, row_bytes, row_begin, row_end, x, y, y_stride);
    case WFormat::kQ4_0:
      return QuantRows<WFormat::kQ4_0>(w, row_bytes, row_begin, row_end, x, y, y_stride);
  }
}

const Kernels kKernels = {TokenBytes, Prepare, DotRows};

}  // namespace
}  // namespace moetier::kernels::isa
