// AVX-512 kernels (512-bit, F/BW/VL/DQ), included by matmul_avx512.cpp, by
// matmul_avx512vnni.cpp (MOETIER_KERNEL_AVX512VNNI: int8 dots with vpdpbusd) and by
// matmul_avx512bf16.cpp (MOETIER_KERNEL_AVX512BF16: also bf16 weights with vdpbf16ps), each
// compiled with its ISA's -m flags. Everything here has internal linkage (see matmul_isa.h).
//
// Shapes: a tile is R weight rows x C tokens; each (row, token) pair owns one 16-lane float32
// accumulator, updated once per 16 elements (fp32 math), per 32 elements (vdpbf16ps) or per
// pair of 32-blocks (quantized), in k order, then summed across lanes in a fixed tree. R and C
// never change an element's arithmetic, so results do not depend on the row split.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul_isa.h"

namespace moetier::kernels::isa {
namespace {

#if defined(MOETIER_KERNEL_AVX512VNNI) || defined(MOETIER_KERNEL_AVX512BF16)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif
#if defined(MOETIER_KERNEL_AVX512BF16)
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

inline float HSum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

inline __mmask16 TailMask16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline __mmask32 TailMask32(int64_t n) {
  return static_cast<__mmask32>((uint64_t{1} << n) - 1u);
}

// ---------------------------------------------------------------------------------------------
// Float formats, fp32 arithmetic: 16 weights per step, converted exactly to float32.

// 16 weights from element i of `row`; `m` selects the ones to read (the others are zero and
// are never touched in memory, so a tail never reads past the row).
template <WFormat F>
inline __m512 Load16(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (F == WFormat::kF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (F == WFormat::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
  }
}

template <WFormat F, int R, int C>
void FloatTile(const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t y_stride) {
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __mmask16 all = 0xFFFF;
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = k - i >= 16 ? all : TailMask16(k - i);
    __m512 wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = Load16<F>(w + r * row_bytes, i, m);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + c * k + i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * y_stride + r] = HSum(acc[r][c]);
}

// Converts rows to float32 in `out` (row stride `stride` floats), exactly.
template <WFormat F>
void ConvertRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                 int64_t stride) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 m = k - i >= 16 ? 0xFFFF : TailMask16(k - i);
      _mm512_mask_storeu_ps(out + r * stride + i, m, Load16<F>(w + r * row_bytes, i, m));
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 weights x bf16-rounded activations with vdpbf16ps (kAvx512Bf16 only).

#if defined(MOETIER_KERNEL_AVX512BF16)
template <int R, int C>
void Bf16Tile(const uint8_t* w, int64_t row_bytes, const uint8_t* xb, int64_t token_bytes,
              int64_t k, float* y, int64_t y_stride) {
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 32) {
    const __mmask32 m = k - i >= 32 ? 0xFFFFFFFFu : TailMask32(k - i);
    __m512i wv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, w + r * row_bytes + 2 * i);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      // Zero padded to a multiple of 32 by Prepare: a full load stays inside the record.
      const __m512i xv = _mm512_load_si512(xb + c * token_bytes + 2 * i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)wv[r], (__m512bh)xv);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * y_stride + r] = HSum(acc[r][c]);
}
#endif

// ---------------------------------------------------------------------------------------------
// Quantized formats: int8 dots over a pair of 32-blocks per 512-bit register (lanes 0..7 the
// first block, 8..15 the second), scaled per block in float32. An odd last block is paired with
// zeros: its weights read as zero and the prepared activations' padding (quants, scales and
// bias) is zero, so the empty half adds exactly 0.

template <WFormat F>
constexpr int64_t QBlockBytes() {
  return F == WFormat::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes;
}

struct QuantPair {
  __m512i q;        // Q8_0: codes (kVnni: + 128, as uint8); Q4_0: 4-bit codes, natural order
  __m512i absq;     // Q8_0 without VNNI: |codes|
  __mmask64 neg;    // Q8_0 without VNNI: codes < 0
  __m512 d;         // scales: lanes 0..7 block b, 8..15 block b + 1
};

template <WFormat F>
inline QuantPair LoadQuantPair(const uint8_t* blk, bool second) {
  QuantPair qp;
  const uint8_t* blk1 = blk + QBlockBytes<F>();
  uint16_t h0, h1 = 0;
  std::memcpy(&h0, blk, 2);
  if (second) std::memcpy(&h1, blk1, 2);
  const __m256i hh =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(h0))),
                              _mm_set1_epi16(static_cast<short>(h1)), 1);
  qp.d = _mm512_cvtph_ps(hh);
  if constexpr (F == WFormat::kQ8_0) {
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i q1 = second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk1 + 2))
                              : _mm256_setzero_si256();
    qp.q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    if constexpr (kVnni) {
      qp.q = _mm512_xor_si512(qp.q, _mm512_set1_epi8(static_cast<char>(0x80)));  // + 128
      qp.absq = qp.q;
      qp.neg = 0;
    } else {
      qp.absq = _mm512_abs_epi8(qp.q);
      qp.neg = _mm512_movepi8_mask(qp.q);
    }
  } else {
    // [qs0 | qs0 | qs1 | qs1], then low nibbles in 128-bit lanes 0 and 2 (weights 0..15), high
    // nibbles in lanes 1 and 3 (weights 16..31): both blocks in natural order.
    const __m256i v0 =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    const __m256i v1 = second ? _mm256_broadcastsi128_si256(
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk1 + 2)))
                              : _mm256_setzero_si256();
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
    const __m512i both = _mm512_mask_blend_epi64(0xCC, v, _mm512_srli_epi16(v, 4));
    qp.q = _mm512_and_si512(both, _mm512_set1_epi8(0x0F));
    qp.absq = qp.q;
    qp.neg = 0;
  }
  return qp;
}

template <WFormat F>
inline __m512i PairDot(const QuantPair& w, __m512i xq, __m512i bias) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(bias, w.q, xq);
  } else {
    const __m512i ones = _mm512_set1_epi16(1);
    if constexpr (F == WFormat::kQ8_0) {
      // |w| * (x * sign(w)); pairs stay within int16 (2 * 128 * 127 < 32768).
      const __m512i xs = _mm512_mask_sub_epi8(xq, w.neg, _mm512_setzero_si512(), xq);
      (void)bias;
      return _mm512_madd_epi16(_mm512_maddubs_epi16(w.absq, xs), ones);
    } else {
      return _mm512_add_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(w.q, xq), ones), bias);
    }
  }
}

template <WFormat F, int R, int C>
void QuantTile(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
               int64_t k, float* y, int64_t y_stride) {
  const QuantLayout lay = QuantLayoutFor(k);
  const int64_t nb = k / kBlock;
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += 2) {
    const bool second = b + 1 < nb;
    QuantPair wp[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      wp[r] = LoadQuantPair<F>(w + r * row_bytes + b * QBlockBytes<F>(), second);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* rec = xrec + c * token_bytes;
      const __m512i xq = _mm512_load_si512(rec + b * kBlock);
      const __m512 dx =
          _mm512_load_ps(reinterpret_cast<const float*>(rec + lay.dx_offset) + b * kLanesPerBlock);
      const __m512i bias = _mm512_load_si512(rec + lay.bias_offset + b * kLanesPerBlock * 4);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 s = _mm512_cvtepi32_ps(PairDot<F>(wp[r], xq, bias));
        acc[r][c] = _mm512_fmadd_ps(s, _mm512_mul_ps(wp[r].d, dx), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * y_stride + r] = HSum(acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// Row/token blocking: tiles of up to 4 rows x 4 tokens; remainders use smaller instantiations.

#define MOETIER_TILE_CASES_R(FN, R, ...)                  \
  case R * 8 + 1: FN<R, 1>(__VA_ARGS__); break;           \
  case R * 8 + 2: FN<R, 2>(__VA_ARGS__); break;           \
  case R * 8 + 3: FN<R, 3>(__VA_ARGS__); break;           \
  case R * 8 + 4: FN<R, 4>(__VA_ARGS__); break;
#define MOETIER_TILE_SWITCH(FN, NR, NT, ...)              \
  switch ((NR) * 8 + (NT)) {                              \
    MOETIER_TILE_CASES_R(FN, 1, __VA_ARGS__)              \
    MOETIER_TILE_CASES_R(FN, 2, __VA_ARGS__)              \
    MOETIER_TILE_CASES_R(FN, 3, __VA_ARGS__)              \
    MOETIER_TILE_CASES_R(FN, 4, __VA_ARGS__)              \
    default: break;                                       \
  }

constexpr int64_t kTileRows = 4, kTileTokens = 4;

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
  const int64_t k = x.k;
  // With more tokens than one tile holds, convert each group of rows once (exactly) and reuse
  // it for every token tile; with fewer, convert in registers.
  const bool convert = F != WFormat::kF32 && x.n_tokens > kTileTokens;
  const int64_t stride = RoundUp(k, 64);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kTileRows) {
    const int64_t nr = Min(kTileRows, row_end - r0);
    if (convert) ConvertRows<F>(w + r0 * row_bytes, row_bytes, nr, k, scratch, stride);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTileTokens) {
      const int64_t nt = Min(kTileTokens, x.n_tokens - t0);
      float* yt = y + t0 * y_stride + r0;
      const float* xt = x.x + t0 * k;
      if (convert) {
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

#if defined(MOETIER_KERNEL_AVX512BF16)
struct Bf16Tiles {
  template <int R, int C>
  static void Run(const uint8_t* w, int64_t row_bytes, const uint8_t* xb, int64_t token_bytes,
                  int64_t k, float* y, int64_t y_stride) {
    Bf16Tile<R, C>(w, row_bytes, xb, token_bytes, k, y, y_stride);
  }
};

void Bf16Rows(const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
              const Prepared& x, float* y, int64_t y_stride) {
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kTileRows) {
    const int64_t nr = Min(kTileRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTileTokens) {
      const int64_t nt = Min(kTileTokens, x.n_tokens - t0);
      MOETIER_TILE_SWITCH(Bf16Tiles::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                          x.data + t0 * x.token_bytes, x.token_bytes, x.k,
                          y + t0 * y_stride + r0, y_stride)
    }
  }
}
#endif

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
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kTileRows) {
    const int64_t nr = Min(kTileRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTileTokens) {
      const int64_t nt = Min(kTileTokens, x.n_tokens - t0);
      MOETIER_TILE_SWITCH(QuantTiles<F>::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                          x.data + t0 * x.token_bytes, x.token_bytes, x.k,
                          y + t0 * y_stride + r0, y_stride)
    }
  }
}

#undef MOETIER_TILE_SWITCH
#undef MOETIER_TILE_CASES_R

// ---------------------------------------------------------------------------------------------
// Activation preparation, bit-identical to the scalar reference (matmul_scalar.cpp).

bool UsesBf16Dot(WFormat f) { return kBf16Dot && f == WFormat::kBF16; }

int64_t TokenBytes(WFormat f, int64_t k) {
  if (UsesBf16Dot(f)) return RoundUp(RoundUp(k, 32) * 2, kAlign);
  return f == WFormat::kQ8_0 || f == WFormat::kQ4_0 ? QuantLayoutFor(k).token_bytes : 0;
}

int32_t QuantOffset(WFormat f) {
  if (f == WFormat::kQ4_0) return 8;
  return kVnni ? 128 : 0;
}

#if defined(MOETIER_KERNEL_AVX512BF16)
// float32 -> bf16, round to nearest even (vcvtne2ps2bf16), zero padded to a multiple of 32.
void PrepareBf16(const float* x, int64_t n_tokens, int64_t k, uint8_t* out) {
  const int64_t token_bytes = TokenBytes(WFormat::kBF16, k);
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = out + t * token_bytes;
    std::memset(rec, 0, static_cast<size_t>(token_bytes));
    const float* xt = x + t * k;
    for (int64_t i = 0; i < k; i += 32) {
      const int64_t n0 = Min(16, k - i), n1 = Min(16, k - i - 16);
      const __m512 lo = _mm512_maskz_loadu_ps(TailMask16(n0), xt + i);
      const __m512 hi = n1 > 0 ? _mm512_maskz_loadu_ps(TailMask16(n1), xt + i + 16)
                               : _mm512_setzero_ps();
      _mm512_store_si512(rec + 2 * i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}
#endif

void Prepare(WFormat f, const float* x, int64_t n_tokens, int64_t k, uint8_t* out) {
#if defined(MOETIER_KERNEL_AVX512BF16)
  if (UsesBf16Dot(f)) return PrepareBf16(x, n_tokens, k, out);
#endif
  if (TokenBytes(f, k) == 0) return;
  const QuantLayout lay = QuantLayoutFor(k);
  const int64_t nb = k / kBlock;
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m256i neg_offset = _mm256_set1_epi32(-QuantOffset(f));
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = out + t * lay.token_bytes;
    std::memset(rec, 0, static_cast<size_t>(lay.token_bytes));
    const float* xt = x + t * k;
    for (int64_t b = 0; b < nb; ++b) {
      const __m512 v0 = _mm512_loadu_ps(xt + b * kBlock);
      const __m512 v1 = _mm512_loadu_ps(xt + b * kBlock + 16);
      const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
      __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 0x55));
      const float amax = _mm_cvtss_f32(m4);
      const float d = amax / 127.0f;
      const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      const __m512i q0 =
          _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, id), lo), hi));
      const __m512i q1 =
          _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, id), lo), hi));
      const __m256i q8 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(q0)),
                                                 _mm512_cvtsepi32_epi8(q1), 1);
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
#if defined(MOETIER_KERNEL_AVX512BF16)
      return Bf16Rows(w, row_bytes, row_begin, row_end, x, y, y_stride);
#else
      return FloatRows<WFormat::kBF16>(w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
#endif
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
