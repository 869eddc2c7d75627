// AVX-512 kernels (512-bit, F/BW/VL/DQ), included by matmul_avx512.cpp, by
// matmul_avx512vnni.cpp (MOETIER_KERNEL_AVX512VNNI: int8 dots with vpdpbusd) and by
// matmul_avx512bf16.cpp (MOETIER_KERNEL_AVX512BF16: also bf16 weights with vdpbf16ps) and by
// matmul_amx.cpp (MOETIER_KERNEL_AMX: VNNI, and the tile kernels of matmul_amx_impl.h added
// after this file), each compiled with its ISA's -m flags. Everything here has internal linkage
// (see matmul_isa.h).
//
// Arithmetic per output element (row r, token t), the same whatever the tile shape: the k range
// is cut into steps (16 elements for fp32 math, 32 for vdpbf16ps, a pair of Q8_0 blocks or a
// group of four Q4_0 blocks), step s goes into accumulator s mod A of that element, then the A
// accumulators are summed in a fixed tree and the 16 lanes in another (fp32 math: in the AVX2
// level's order, HSumAvx2Order, so results equal that level's bit for bit). Tiles (R rows x C
// tokens) only decide which elements share loads: results depend neither on the row split
// across threads nor on the number of tokens batched together.
//
// Memory: decode (one token) walks one row at a time, a single sequential stream, prefetching
// kPrefetchBytes ahead, a whole row range per call; prefill tiles (4 rows x 3 tokens for float
// formats, 2 x 4 quantized) reuse each load across rows and tokens, each of their R row streams
// prefetched on into the same row of the next tile (TileAhead).

// GCC 12's AVX-512 intrinsics seed their results with a self-initialised "undefined" vector,
// which -Wuninitialized flags once inlined (GCC 13 does not): a false alarm.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul_isa.h"

namespace moetier::kernels::isa {
namespace {

#if defined(MOETIER_KERNEL_AVX512VNNI) || defined(MOETIER_KERNEL_AVX512BF16) || \
    defined(MOETIER_KERNEL_AMX)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif
#if defined(MOETIER_KERNEL_AVX512BF16)
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

// Independent FMA chains per output element. Two chains of 16-wide FMAs already outrun one
// core's share of DRAM bandwidth (~12 GB/s measured on a Sapphire Rapids VM) for decode, and
// fewer accumulators leave registers for larger prefill tiles.
constexpr int kFloatAcc = 2;
constexpr int kQuantAcc = 2;
// How far ahead of the row being read to prefetch (see matmul_avx2_impl.h for the measurement).
constexpr int64_t kPrefetchBytes = 2048;
// Quantized decode prefetches further, but never past the end of the call's row range (what
// lies there is another task's: fetching it here would read it from DRAM twice, and at 16
// threads a task's run of down-projection rows is only ~7 KB). 4 KB streamed 5-12 % faster than
// 2 KB in kernel_bench's one-token runs, and 8 KB little more (docs/benchmarks.md).
constexpr int64_t kQuantDecodePrefetchBytes = 4096;
constexpr int64_t kQ4Group = 4;  // Q4_0 blocks per 512-bit step (nibble-interleaved layout)

// Loops over tile rows, tokens and accumulators have compile-time trip counts and must unroll
// fully, so that every accumulator lives in a register.
#define MOETIER_UNROLL _Pragma("GCC unroll 16")

// Nothing is prefetched at or past `stop` (an address: the end of a decode call's row range,
// whose next bytes are another task's).
inline void Prefetch(const uint8_t* p, int64_t ahead = kPrefetchBytes,
                     uintptr_t stop = UINTPTR_MAX) {
  if (reinterpret_cast<uintptr_t>(p) + ahead >= stop) return;
  // Through an integer: the address may lie past the end of the weights (prefetch never faults).
  const char* a = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + ahead);
  // Inline asm, not _mm_prefetch: GCC treats a helper that only prefetches as free of side
  // effects and deleted every call to it from the fp32 tiles (seen in GCC 12's output).
  __asm__ volatile("prefetcht0 %0" : : "m"(*a));
}

// How far ahead to prefetch row r of an R-row tile read at byte `offset`: `ahead` bytes along
// the row or, past its end, as far along row r of the next tile (rows are contiguous: R - 1 rows
// further). So each of a tile's row streams runs on into the next tile's, whose rows then do not
// start cold. R == 1: the plain stream.
template <int R>
inline int64_t TileAhead(int64_t offset, int64_t row_bytes, int64_t ahead = kPrefetchBytes) {
  return offset + ahead >= row_bytes ? ahead + (R - 1) * row_bytes : ahead;
}

inline float HSum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

inline int64_t Min(int64_t a, int64_t b) {
  return a < b ? a : b;
}

inline __mmask16 TailMask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}
inline __mmask32 TailMask32(int64_t n) {
  return n >= 32 ? static_cast<__mmask32>(0xFFFFFFFFu)
                 : static_cast<__mmask32>((uint64_t{1} << n) - 1u);
}

// TileOut's output vector (tile_out_impl.h).
struct OutVec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T Zero() { return _mm512_setzero_ps(); }
  static T Insert(T held, int lane, float v) {
    return _mm512_mask_broadcastss_ps(held, static_cast<__mmask16>(1u << lane), _mm_set_ss(v));
  }
  static void Store(float* y, T held) { _mm512_storeu_ps(y, held); }
  static void StoreFirst(float* y, T held, int n) { _mm512_mask_storeu_ps(y, TailMask16(n), held); }
};

#include "kernels/cpu/tile_out_impl.h"

// Runs step(i, a, n) over [0, k) in steps of kWidth elements: step s starts at s * kWidth,
// goes to accumulator a = s mod kA and covers n = min(kWidth, k - i) elements. `a` is a
// compile-time constant at every call (so accumulators stay in registers) and n is the
// constant kWidth on full passes. Each full pass of kA steps first calls prefetch(i).
template <int kA, int64_t kWidth, typename Step, typename Pf>
__attribute__((always_inline)) inline void ForSteps(int64_t k, Step&& step, Pf&& prefetch) {
  static_assert(kA >= 1 && kA <= 4, "up to 4 accumulators");
  int64_t i = 0;
  for (; i + kA * kWidth <= k; i += kA * kWidth) {
    prefetch(i);
    step(i, 0, kWidth);
    if constexpr (kA > 1) step(i + kWidth, 1, kWidth);
    if constexpr (kA > 2) step(i + 2 * kWidth, 2, kWidth);
    if constexpr (kA > 3) step(i + 3 * kWidth, 3, kWidth);
  }
  const int64_t left = k - i;  // < kA * kWidth: the cycle continues at accumulator 0
  if (left > 0) step(i, 0, Min(kWidth, left));
  if constexpr (kA > 1)
    if (left > kWidth) step(i + kWidth, 1, Min(kWidth, left - kWidth));
  if constexpr (kA > 2)
    if (left > 2 * kWidth) step(i + 2 * kWidth, 2, Min(kWidth, left - 2 * kWidth));
  if constexpr (kA > 3)
    if (left > 3 * kWidth) step(i + 3 * kWidth, 3, left - 3 * kWidth);
}

// The fp32 tiles' final sum, in the AVX2 kernels' order (matmul_avx2_impl.h): the two 16-lane
// accumulators of a 32-element pass are that level's four 8-lane ones, [acc0 | acc1] and
// [acc2 | acc3], summed as (acc0 + acc1) + (acc2 + acc3), then 8 lanes as (0 + 4, 1 + 5, 2 + 6,
// 3 + 7), then (0 + 2) + (1 + 3). So every fp32-math result here equals the AVX2 level's bit
// for bit, and BF16C decode (AVX2 kernels) and BF16C batches expanded for these tiles agree.
inline float HSumAvx2Order(__m512 a01, __m512 a23) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(a01), _mm512_extractf32x8_ps(a01, 1));
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a23), _mm512_extractf32x8_ps(a23, 1));
  const __m256 v = _mm256_add_ps(a, b);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

template <int kA>
inline float HSumAcc(const __m512* a) {
  if constexpr (kA == 1) return HSum(a[0]);
  if constexpr (kA == 2) return HSum(_mm512_add_ps(a[0], a[1]));
  if constexpr (kA == 4)
    return HSum(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

// ---------------------------------------------------------------------------------------------
// Float formats, fp32 arithmetic: 16 weights per step, converted exactly to float32.

template <WFormat F>
constexpr int64_t ElemBytes() {
  return F == WFormat::kF32 ? 4 : 2;
}

// 16 weights from element i of `row`.
template <WFormat F>
inline __m512 Load16(const uint8_t* row, int64_t i) {
  if constexpr (F == WFormat::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (F == WFormat::kBF16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
  }
}

// As Load16, but only the weights `m` selects are read (the others are zero and never touched
// in memory, so a tail never reads past the row).
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
__attribute__((always_inline)) inline void FloatTileOnce(const uint8_t* w, int64_t row_bytes,
                                                         const float* x, int64_t k,
                                                         TileOut<R, C>& out) {
  __m512 acc[R][C][kFloatAcc];
  MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
      MOETIER_UNROLL for (int a = 0; a < kFloatAcc; ++a) acc[r][c][a] = _mm512_setzero_ps();
  auto step = [&](int64_t i, int a, int64_t n) __attribute__((always_inline)) {
    const bool full = n == 16;  // a constant on full passes: plain loads there
    const __mmask16 m = TailMask16(n);
    __m512 wv[R];
    MOETIER_UNROLL for (int r = 0; r < R; ++r) wv[r] =
        full ? Load16<F>(w + r * row_bytes, i) : Load16<F>(w + r * row_bytes, i, m);
    MOETIER_UNROLL for (int c = 0; c < C; ++c) {
      const __m512 xv =
          full ? _mm512_loadu_ps(x + c * k + i) : _mm512_maskz_loadu_ps(m, x + c * k + i);
      MOETIER_UNROLL for (int r = 0; r < R; ++r) acc[r][c][a] =
          _mm512_fmadd_ps(wv[r], xv, acc[r][c][a]);
    }
  };
  auto prefetch = [&](int64_t i) __attribute__((always_inline)) {
    const int64_t ahead = TileAhead<R>(i * ElemBytes<F>(), row_bytes);
    for (int r = 0; r < R; ++r)
      for (int64_t b = 0; b < kFloatAcc * 16 * ElemBytes<F>(); b += 64)
        Prefetch(w + r * row_bytes + i * ElemBytes<F>() + b, ahead);
  };
  ForSteps<kFloatAcc, 16>(k, step, prefetch);
  static_assert(kFloatAcc == 2, "HSumAvx2Order takes the two accumulators of a 32-element pass");
  MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
      out.Put(r, c, HSumAvx2Order(acc[r][c][0], acc[r][c][1]));
}

// `n_tiles` tiles of R rows one after the other (decode runs a whole row range in one call).
template <WFormat F, int R, int C>
void FloatTile(const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t y_stride, int64_t n_tiles = 1) {
  TileOut<R, C> out(y, y_stride);
  for (int64_t tile = 0; tile < n_tiles; ++tile, w += R * row_bytes, out.NextTile())
    FloatTileOnce<F, R, C>(w, row_bytes, x, k, out);
  out.Flush();
}

// Converts rows to float32 in `out` (row stride `stride` floats), exactly, prefetching `ahead`
// bytes in front of its reads (0: none) short of `stop`, as the AVX2 level's ConvertRows does.
template <WFormat F>
void ConvertRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                 int64_t stride, int64_t ahead, uintptr_t stop) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < k; i += 16) {
      if (ahead > 0 && (i * ElemBytes<F>()) % 64 == 0)
        Prefetch(w + r * row_bytes + i * ElemBytes<F>(), ahead, stop);
      const __mmask16 m = TailMask16(k - i);
      _mm512_mask_storeu_ps(out + r * stride + i, m, Load16<F>(w + r * row_bytes, i, m));
    }
}

// BF16C batches reach these kernels only where AVX2 is present (IsaForWeights in matmul.cpp):
// its block decoder (slot order made for 256-bit unpacks) converts the rows.
template <>
void ConvertRows<WFormat::kBF16C>(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
                                  float* out, int64_t stride, int64_t ahead, uintptr_t stop) {
  Avx2Bf16cRowsToF32(w, row_bytes, n_rows, k, out, stride, ahead, stop);
}

// ---------------------------------------------------------------------------------------------
// bf16 weights x bf16-rounded activations with vdpbf16ps (kAvx512Bf16 only): 32 per step.

#if defined(MOETIER_KERNEL_AVX512BF16)
template <int R, int C>
__attribute__((always_inline)) inline void Bf16TileOnce(const uint8_t* w, int64_t row_bytes,
                                                        const uint8_t* xb, int64_t token_bytes,
                                                        int64_t k, TileOut<R, C>& out) {
  __m512 acc[R][C][kFloatAcc];
  MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
      MOETIER_UNROLL for (int a = 0; a < kFloatAcc; ++a) acc[r][c][a] = _mm512_setzero_ps();
  auto step = [&](int64_t i, int a, int64_t n) __attribute__((always_inline)) {
    const bool full = n == 32;  // a constant on full passes: plain loads there
    const __mmask32 m = TailMask32(n);
    __m512i wv[R];
    MOETIER_UNROLL for (int r = 0; r < R; ++r) wv[r] =
        full ? _mm512_loadu_si512(w + r * row_bytes + 2 * i)
             : _mm512_maskz_loadu_epi16(m, w + r * row_bytes + 2 * i);
    MOETIER_UNROLL for (int c = 0; c < C; ++c) {
      // Zero padded to a multiple of 32 by Prepare: a full load stays inside the record.
      const __m512i xv = _mm512_load_si512(xb + c * token_bytes + 2 * i);
      MOETIER_UNROLL for (int r = 0; r < R; ++r) acc[r][c][a] =
          _mm512_dpbf16_ps(acc[r][c][a], (__m512bh)wv[r], (__m512bh)xv);
    }
  };
  auto prefetch = [&](int64_t i) __attribute__((always_inline)) {
    const int64_t ahead = TileAhead<R>(2 * i, row_bytes);
    MOETIER_UNROLL for (int r = 0; r < R; ++r) for (int64_t b = 0; b < kFloatAcc * 64; b += 64)
        Prefetch(w + r * row_bytes + 2 * i + b, ahead);
  };
  ForSteps<kFloatAcc, 32>(k, step, prefetch);
  MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
      out.Put(r, c, HSumAvx2Order(acc[r][c][0], acc[r][c][1]));
}

// `n_tiles` tiles of R rows one after the other (decode runs a whole row range in one call).
template <int R, int C>
void Bf16Tile(const uint8_t* w, int64_t row_bytes, const uint8_t* xb, int64_t token_bytes,
              int64_t k, float* y, int64_t y_stride, int64_t n_tiles = 1) {
  TileOut<R, C> out(y, y_stride);
  for (int64_t tile = 0; tile < n_tiles; ++tile, w += R * row_bytes, out.NextTile())
    Bf16TileOnce<R, C>(w, row_bytes, xb, token_bytes, k, out);
  out.Flush();
}
#endif

// ---------------------------------------------------------------------------------------------
// Quantized formats: int8 dots, scaled per block in float32. A step fills one 512-bit register
// of quants: two Q8_0 blocks (natural layout, 8 lanes each) or four Q4_0 blocks
// (nibble-interleaved layout, 4 lanes each). Blocks past the row's end read as zero.

template <WFormat F>
constexpr int64_t QBlockBytes() {
  return F == WFormat::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes;
}
template <WFormat F>
constexpr int64_t StepBlocks() {
  return F == WFormat::kQ8_0 ? 2 : kQ4Group;
}

struct QuantStep {
  __m512i q;      // Q8_0: codes (kVnni: + 128, as uint8); Q4_0: low nibbles of the 4 blocks
  __m512i q2;     // Q8_0 without VNNI: |codes|; Q4_0: high nibbles
  __mmask64 neg;  // Q8_0 without VNNI: codes < 0
  __m512 d;       // the weight scale of each lane's block
};

// Word indices for vpermw/vpermt2w gathers from the step's bytes (a = bytes 0..63, and for
// Q4_0 b = bytes 8..71, indices 32.. selecting from b): word 9j is block j's fp16 scale in a
// Q4_0 step (18-byte blocks), word 17j in a Q8_0 step (34-byte blocks).
alignas(64) constexpr uint16_t kQ8ScaleIdx[32] = {0,  0,  0,  0,  0,  0, 0, 0, 17, 17, 17,
                                                  17, 17, 17, 17, 17, 0, 0, 0, 0,  0,  0,
                                                  0,  0,  0,  0,  0,  0, 0, 0, 0,  0};
alignas(64) constexpr uint16_t kQ4ScaleIdx[32] = {0,  0,  0,  0,  9,  9, 9, 9, 18, 18, 18,
                                                  18, 27, 27, 27, 27, 0, 0, 0, 0,  0,  0,
                                                  0,  0,  0,  0,  0,  0, 0, 0, 0,  0};
// The 4 blocks' 16 code bytes (words 1..8, 10..17, 19..26 of a; 24..31 of b = bytes 56..71).
alignas(64) constexpr uint16_t kQ4CodeIdx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12,
                                                 13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24,
                                                 25, 26, 56, 57, 58, 59, 60, 61, 62, 63};

inline __m512i LoadIdx(const uint16_t* idx) {
  return _mm512_load_si512(idx);
}

// One step of weights. A full step (n_blocks == StepBlocks) gathers its scales (and Q4_0 codes)
// with word permutes from two or three wide loads that stay inside the step; a last, partial
// step reads block by block and never past its last block.
template <WFormat F>
inline QuantStep LoadStep(const uint8_t* blk, int64_t n_blocks) {
  QuantStep st;
  st.neg = 0;
  const bool full = n_blocks == StepBlocks<F>();
  __m512i codes = _mm512_setzero_si512();  // Q4_0: 4 x 16 code bytes
  if (full) {
    const __m512i a = _mm512_loadu_si512(blk);
    if constexpr (F == WFormat::kQ8_0) {
      st.d = _mm512_cvtph_ps(
          _mm512_castsi512_si256(_mm512_permutexvar_epi16(LoadIdx(kQ8ScaleIdx), a)));
    } else {
      st.d = _mm512_cvtph_ps(
          _mm512_castsi512_si256(_mm512_permutexvar_epi16(LoadIdx(kQ4ScaleIdx), a)));
      const __m512i b = _mm512_loadu_si512(blk + 8);
      codes = _mm512_permutex2var_epi16(a, LoadIdx(kQ4CodeIdx), b);
    }
  } else {
    uint16_t h[4] = {0, 0, 0, 0};
    for (int64_t j = 0; j < n_blocks; ++j) std::memcpy(&h[j], blk + j * QBlockBytes<F>(), 2);
    const __m128 d4 = _mm_cvtph_ps(
        _mm_setr_epi16(static_cast<short>(h[0]), static_cast<short>(h[1]), static_cast<short>(h[2]),
                       static_cast<short>(h[3]), 0, 0, 0, 0));
    const __m512i spread = F == WFormat::kQ8_0
                               ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                               : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    st.d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
    if constexpr (F == WFormat::kQ4_0) {
      alignas(64) uint8_t buf[64] = {};
      for (int64_t j = 0; j < n_blocks; ++j)
        std::memcpy(buf + 16 * j, blk + j * kQ4_0Bytes + 2, 16);
      codes = _mm512_load_si512(buf);
    }
  }
  if constexpr (F == WFormat::kQ8_0) {
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i q1 =
        n_blocks > 1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ8_0Bytes + 2))
                     : _mm256_setzero_si256();
    st.q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    if constexpr (kVnni) {
      st.q = _mm512_xor_si512(st.q, _mm512_set1_epi8(static_cast<char>(0x80)));  // + 128
      st.q2 = st.q;
    } else {
      st.q2 = _mm512_abs_epi8(st.q);
      st.neg = _mm512_movepi8_mask(st.q);
    }
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    st.q = _mm512_and_si512(codes, m4);
    st.q2 = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
  }
  return st;
}

// int32 lanes of one step's dot with the activation quants at `xq` (64 bytes per Q8_0 pair,
// 128 per Q4_0 group: low halves then high halves), plus the prepared bias.
template <WFormat F>
inline __m512i StepDot(const QuantStep& w, const uint8_t* xq, __m512i bias) {
  const __m512i x0 = _mm512_load_si512(xq);
  if constexpr (F == WFormat::kQ8_0) {
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(bias, w.q, x0);
    } else {
      // |w| * (x * sign(w)); pairs stay within int16 (2 * 128 * 127 < 32768); offset 0.
      (void)bias;
      const __m512i xs = _mm512_mask_sub_epi8(x0, w.neg, _mm512_setzero_si512(), x0);
      return _mm512_madd_epi16(_mm512_maddubs_epi16(w.q2, xs), _mm512_set1_epi16(1));
    }
  } else {
    const __m512i x1 = _mm512_load_si512(xq + 64);
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, w.q, x0), w.q2, x1);
    } else {
      // codes 0..15 x int8: each pair sum <= 2 * 15 * 127, two of them still fit int16.
      const __m512i p =
          _mm512_add_epi16(_mm512_maddubs_epi16(w.q, x0), _mm512_maddubs_epi16(w.q2, x1));
      return _mm512_add_epi32(_mm512_madd_epi16(p, _mm512_set1_epi16(1)), bias);
    }
  }
}

// Runs step(s, a, n_blocks) over a row's nb blocks in steps of StepBlocks<F>: full steps in
// pairs into accumulators 0 and 1, prefetch(s) before each pair, then at most one full and one
// partial step continuing the cycle. `a` is a compile-time constant at every call.
template <WFormat F, typename Step, typename Pf>
__attribute__((always_inline)) inline void ForQuantSteps(int64_t nb, Step&& step, Pf&& prefetch) {
  static_assert(kQuantAcc == 2, "pairs of steps, one per accumulator");
  const int64_t n_full = nb / StepBlocks<F>();  // steps with every block present
  int64_t s = 0;
  for (; s + 2 <= n_full; s += 2) {
    prefetch(s);
    step(s, 0, StepBlocks<F>());
    step(s + 1, 1, StepBlocks<F>());
  }
  int a = 0;
  if (s < n_full) {
    step(s++, 0, StepBlocks<F>());
    a = 1;
  }
  const int64_t rest = nb - s * StepBlocks<F>();
  if (rest > 0) {
    if (a == 0) step(s, 0, rest);
    if (a == 1) step(s, 1, rest);
  }
}

template <WFormat F, int R, int C>
__attribute__((always_inline)) inline void QuantTileOnce(const uint8_t* w, int64_t row_bytes,
                                                         const uint8_t* xrec, int64_t token_bytes,
                                                         int64_t k, TileOut<R, C>& out) {
  const QuantLayout lay = QuantLayoutFor(k, F == WFormat::kQ8_0 ? 1 : kQ4Group);
  const int64_t nb = k / kBlock;
  constexpr int64_t kStepBytes = StepBlocks<F>() * QBlockBytes<F>();  // weight bytes per step
  constexpr int64_t kStepQx = StepBlocks<F>() * kBlock;               // activation quants per step
  static_assert(kQuantAcc == 2, "the final sum below adds 2 accumulators");
  __m512 acc[R][C][kQuantAcc];
  MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
      MOETIER_UNROLL for (int a = 0; a < kQuantAcc; ++a) acc[r][c][a] = _mm512_setzero_ps();
  // One step into accumulator a; n_blocks < StepBlocks only for a last, partial step.
  auto step = [&](int64_t s, int a, int64_t n_blocks) __attribute__((always_inline)) {
    QuantStep ws[R];
    MOETIER_UNROLL for (int r = 0; r < R; ++r) ws[r] =
        LoadStep<F>(w + r * row_bytes + s * kStepBytes, n_blocks);
    MOETIER_UNROLL for (int c = 0; c < C; ++c) {
      const uint8_t* rec = xrec + c * token_bytes;
      const __m512 dx =
          _mm512_load_ps(reinterpret_cast<const float*>(rec + lay.dx_offset) + 16 * s);
      const __m512i bias = _mm512_load_si512(rec + lay.bias_offset + 64 * s);
      MOETIER_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 v = _mm512_cvtepi32_ps(StepDot<F>(ws[r], rec + s * kStepQx, bias));
        acc[r][c][a] = _mm512_fmadd_ps(v, _mm512_mul_ps(ws[r].d, dx), acc[r][c][a]);
      }
    }
  };
  ForQuantSteps<F>(
      nb, step, [&](int64_t s) __attribute__((always_inline)) {
        const int64_t ahead = TileAhead<R>(s * kStepBytes, row_bytes);
        MOETIER_UNROLL for (int r = 0; r < R; ++r) for (int64_t b = 0; b < kQuantAcc * kStepBytes;
                                                        b += 64)
            Prefetch(w + r * row_bytes + s * kStepBytes + b, ahead);
      });
  MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
      out.Put(r, c, HSum(_mm512_add_ps(acc[r][c][0], acc[r][c][1])));
}

// One prefill tile of R rows x C tokens (decode runs QuantDecodeRows).
template <WFormat F, int R, int C>
void QuantTile(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
               int64_t k, float* y, int64_t y_stride) {
  TileOut<R, C> out(y, y_stride);
  QuantTileOnce<F, R, C>(w, row_bytes, xrec, token_bytes, k, out);
  out.Flush();
}

// Decode: one row against one token, the arithmetic of QuantTileOnce<F, 1, 1> (the same steps
// into the same two accumulators, the same sums), written on its own and returning the result.
// The same source through QuantTileOnce's general tile streamed ~25 % slower on a Zen 5 core;
// the generated loops differ only in register use and instruction order, so this is measured,
// not explained.
template <WFormat F>
__attribute__((always_inline)) inline float QuantDecodeRow(const uint8_t* w, const uint8_t* xrec,
                                                           int64_t k, int64_t ahead,
                                                           uintptr_t stop) {
  const QuantLayout lay = QuantLayoutFor(k, F == WFormat::kQ8_0 ? 1 : kQ4Group);
  const int64_t nb = k / kBlock;
  constexpr int64_t kStepBytes = StepBlocks<F>() * QBlockBytes<F>();
  constexpr int64_t kStepQx = StepBlocks<F>() * kBlock;
  static_assert(kQuantAcc == 2, "two accumulators, as QuantTileOnce");
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  auto step = [&](int64_t s, int a, int64_t n_blocks) __attribute__((always_inline)) {
    const QuantStep ws = LoadStep<F>(w + s * kStepBytes, n_blocks);
    const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(xrec + lay.dx_offset) + 16 * s);
    const __m512i bias = _mm512_load_si512(xrec + lay.bias_offset + 64 * s);
    const __m512 v = _mm512_cvtepi32_ps(StepDot<F>(ws, xrec + s * kStepQx, bias));
    if (a == 0) acc0 = _mm512_fmadd_ps(v, _mm512_mul_ps(ws.d, dx), acc0);
    if (a == 1) acc1 = _mm512_fmadd_ps(v, _mm512_mul_ps(ws.d, dx), acc1);
  };
  ForQuantSteps<F>(
      nb, step, [&](int64_t s) __attribute__((always_inline)) {
        for (int64_t b = 0; b < 2 * kStepBytes; b += 64)
          Prefetch(w + s * kStepBytes + b, ahead, stop);
      });
  return HSum(_mm512_add_ps(acc0, acc1));
}

// Decode: `n_rows` rows one after the other, their results gathered 16 at a time (TileOut says
// why), prefetching `ahead` bytes in front but nothing at or past the end of the rows. `ahead`
// must not be a compile-time constant (Prepared::quant_prefetch_bytes says why).
template <WFormat F>
void QuantDecodeRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, const uint8_t* xrec,
                     int64_t k, float* y, int64_t ahead) {
  const uintptr_t stop = reinterpret_cast<uintptr_t>(w + n_rows * row_bytes);
  auto group = [&](int64_t r0, int n) __attribute__((always_inline)) {
    __m512 held = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j, w += row_bytes) {
      const float v = QuantDecodeRow<F>(w, xrec, k, ahead, stop);
      held = _mm512_mask_mov_ps(held, static_cast<__mmask16>(1u << j), _mm512_set1_ps(v));
    }
    _mm512_mask_storeu_ps(y + r0, TailMask16(n), held);
  };
  int64_t r0 = 0;
  for (; r0 + 16 <= n_rows; r0 += 16) group(r0, 16);
  if (r0 < n_rows) group(r0, static_cast<int>(n_rows - r0));
}

// ---------------------------------------------------------------------------------------------
// Row/token blocking: (1 row x 1 token) for decode, up to 2 rows x kTokens for prefill;
// remainders use smaller instantiations (same per-element arithmetic).

#define MOETIER_TILE_CASES_R(FN, R, ...) \
  case R * 8 + 1:                        \
    FN<R, 1>(__VA_ARGS__);               \
    break;                               \
  case R * 8 + 2:                        \
    FN<R, 2>(__VA_ARGS__);               \
    break;                               \
  case R * 8 + 3:                        \
    FN<R, 3>(__VA_ARGS__);               \
    break;                               \
  case R * 8 + 4:                        \
    FN<R, 4>(__VA_ARGS__);               \
    break;
#define MOETIER_TILE_SWITCH(FN, NR, NT, ...) \
  switch ((NR)*8 + (NT)) {                   \
    MOETIER_TILE_CASES_R(FN, 1, __VA_ARGS__) \
    MOETIER_TILE_CASES_R(FN, 2, __VA_ARGS__) \
    MOETIER_TILE_CASES_R(FN, 3, __VA_ARGS__) \
    MOETIER_TILE_CASES_R(FN, 4, __VA_ARGS__) \
    default:                                 \
      break;                                 \
  }

// Prefill tile shapes: 32 zmm registers hold R x C x A accumulators plus the operands.
constexpr int64_t kFloatRows = 4, kFloatTokens = 3;  // 4 x 3 x 2 = 24 accumulators
constexpr int64_t kQuantRows = 2, kQuantTokens = 4;  // 2 x 4 x 2 = 16 (+ 2 x 4 weight regs)

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
  // BF16C is the AVX2 kernels' format (the dispatcher sends one token there: its slot order
  // suits 256-bit unpacks); batches come here and run as float32 rows that code decodes.
  if (x.n_tokens == 1 && F != WFormat::kBF16C) {  // decode: the whole row range in one call
    if (row_end > row_begin)
      FloatTile<F, 1, 1>(w + row_begin * row_bytes, row_bytes, x.x, k, y + row_begin, y_stride,
                         row_end - row_begin);
    return;
  }
  constexpr int64_t kRows = kFloatRows;
  // More tokens than one tile holds: each group of rows converted to float32 once for every
  // token tile (Prepared::convert_batch_rows), or converted in registers by each tile, BF16C
  // rows expanded to bf16 first (by the AVX2 code, as above); fewer: in registers.
  const bool to_f32 = F != WFormat::kF32 && x.convert_batch_rows &&
                      (F == WFormat::kBF16C || x.n_tokens > kFloatTokens);
  const bool to_bf16 = F == WFormat::kBF16C && !x.convert_batch_rows;
  const int64_t stride = RoundUp(k, 64);
  const auto stop = reinterpret_cast<uintptr_t>(w + row_end * row_bytes);  // see Prefetch
  auto* expanded = reinterpret_cast<uint16_t*>(scratch);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int64_t nr = Min(kRows, row_end - r0);
    if (to_f32)
      ConvertRows<F>(w + r0 * row_bytes, row_bytes, nr, k, scratch, stride, x.float_prefetch_bytes,
                     stop);
    if (to_bf16)
      Avx2ExpandBf16cRows(w + r0 * row_bytes, row_bytes, nr, k, expanded, x.float_prefetch_bytes,
                          stop);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kFloatTokens) {
      const int64_t nt = Min(kFloatTokens, x.n_tokens - t0);
      float* yt = y + t0 * y_stride + r0;
      const float* xt = x.x + t0 * k;
      if (to_f32) {
        const auto* cw = reinterpret_cast<const uint8_t*>(scratch);
        MOETIER_TILE_SWITCH(FloatTiles<WFormat::kF32>::template Run, nr, nt, cw, stride * 4, xt, k,
                            yt, y_stride)
      } else if (to_bf16) {
        const auto* bw = reinterpret_cast<const uint8_t*>(expanded);
        MOETIER_TILE_SWITCH(FloatTiles<WFormat::kBF16>::template Run, nr, nt, bw, 2 * k, xt, k, yt,
                            y_stride)
      } else if constexpr (F != WFormat::kBF16C) {
        MOETIER_TILE_SWITCH(FloatTiles<F>::template Run, nr, nt, w + r0 * row_bytes, row_bytes, xt,
                            k, yt, y_stride)
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
  if (x.n_tokens == 1) {  // decode: the whole row range in one call
    if (row_end > row_begin)
      Bf16Tile<1, 1>(w + row_begin * row_bytes, row_bytes, x.data, x.token_bytes, x.k,
                     y + row_begin, y_stride, row_end - row_begin);
    return;
  }
  constexpr int64_t kRows = kFloatRows;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int64_t nr = Min(kRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kFloatTokens) {
      const int64_t nt = Min(kFloatTokens, x.n_tokens - t0);
      MOETIER_TILE_SWITCH(Bf16Tiles::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                          x.data + t0 * x.token_bytes, x.token_bytes, x.k, y + t0 * y_stride + r0,
                          y_stride)
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
  if (x.n_tokens == 1) {  // decode: one row after the other (one stream), in one call
    if (row_end > row_begin)
      QuantDecodeRows<F>(
          w + row_begin * row_bytes, row_bytes, row_end - row_begin, x.data, x.k, y + row_begin,
          x.quant_prefetch_bytes > 0 ? x.quant_prefetch_bytes : kQuantDecodePrefetchBytes);
    return;
  }
  constexpr int64_t kRows = kQuantRows;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int64_t nr = Min(kRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kQuantTokens) {
      const int64_t nt = Min(kQuantTokens, x.n_tokens - t0);
      MOETIER_TILE_SWITCH(QuantTiles<F>::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                          x.data + t0 * x.token_bytes, x.token_bytes, x.k, y + t0 * y_stride + r0,
                          y_stride)
    }
  }
}

#undef MOETIER_TILE_SWITCH
#undef MOETIER_TILE_CASES_R
#undef MOETIER_UNROLL

// ---------------------------------------------------------------------------------------------
// Activation preparation, bit-identical to the scalar reference (matmul_scalar.cpp) up to the
// layout: same amax, scale, rounding and clamping.

bool UsesBf16Dot(WFormat f) {
  return kBf16Dot && f == WFormat::kBF16;
}

int64_t TokenBytes(WFormat f, int64_t k) {
  if (UsesBf16Dot(f)) return RoundUp(RoundUp(k, 32) * 2, kAlign);
  if (f == WFormat::kQ8_0) return QuantLayoutFor(k, 1).token_bytes;
  if (f == WFormat::kQ4_0) return QuantLayoutFor(k, kQ4Group).token_bytes;
  return 0;
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
      const __m512 lo = _mm512_maskz_loadu_ps(TailMask16(k - i), xt + i);
      const __m512 hi = k - i > 16 ? _mm512_maskz_loadu_ps(TailMask16(k - i - 16), xt + i + 16)
                                   : _mm512_setzero_ps();
      _mm512_store_si512(rec + 2 * i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}
#endif

// Quantizes one 32-block: its 32 quants in natural order, and its scale.
inline __m256i QuantizeBlock(const float* x, float* d_out) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512 v0 = _mm512_loadu_ps(x);
  const __m512 v1 = _mm512_loadu_ps(x + 16);
  const __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
  const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 0x55));
  const float amax = _mm_cvtss_f32(m4);
  *d_out = amax / 127.0f;
  const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
  const __m512i q0 =
      _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v0, id), lo), hi));
  const __m512i q1 =
      _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v1, id), lo), hi));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(q0)),
                                 _mm512_cvtsepi32_epi8(q1), 1);
}

// Sums of 4 consecutive int8 in each int32 lane.
inline __m256i LaneSums(__m256i q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}

void Prepare(WFormat f, const float* x, int64_t n_tokens, int64_t k, uint8_t* out) {
#if defined(MOETIER_KERNEL_AVX512BF16)
  if (UsesBf16Dot(f)) return PrepareBf16(x, n_tokens, k, out);
#endif
  if (TokenBytes(f, k) == 0) return;
  const int64_t group = f == WFormat::kQ4_0 ? kQ4Group : 1;
  const QuantLayout lay = QuantLayoutFor(k, group);
  const int64_t nb = k / kBlock;
  const __m256i neg_offset = _mm256_set1_epi32(-QuantOffset(f));
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = out + t * lay.token_bytes;
    std::memset(rec, 0, static_cast<size_t>(lay.token_bytes));
    const float* xt = x + t * k;
    auto* dx = reinterpret_cast<float*>(rec + lay.dx_offset);
    auto* bias = reinterpret_cast<int32_t*>(rec + lay.bias_offset);
    if (group == 1) {
      for (int64_t b = 0; b < nb; ++b) {
        float d;
        const __m256i q = QuantizeBlock(xt + b * kBlock, &d);
        _mm256_store_si256(reinterpret_cast<__m256i*>(rec + b * kBlock), q);
        _mm256_store_ps(dx + 8 * b, _mm256_set1_ps(d));
        _mm256_store_si256(reinterpret_cast<__m256i*>(bias + 8 * b),
                           _mm256_mullo_epi32(LaneSums(q), neg_offset));
      }
      continue;
    }
    // Nibble-interleaved groups of 4: the low 16 quants of each block, then the high 16.
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t g = b / group, j = b % group;
      float d;
      const __m256i q = QuantizeBlock(xt + b * kBlock, &d);
      uint8_t* base = rec + g * group * kBlock;
      _mm_store_si128(reinterpret_cast<__m128i*>(base + 16 * j), _mm256_castsi256_si128(q));
      _mm_store_si128(reinterpret_cast<__m128i*>(base + 16 * (group + j)),
                      _mm256_extracti128_si256(q, 1));
      _mm_store_ps(dx + 4 * b, _mm_set1_ps(d));
      // Lane l of this block: quants 4l..4l+3 plus 16+4l..16+4l+3.
      const __m256i s = LaneSums(q);
      const __m128i lane = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      _mm_store_si128(reinterpret_cast<__m128i*>(bias + 4 * b),
                      _mm_mullo_epi32(lane, _mm256_castsi256_si128(neg_offset)));
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
    case WFormat::kBF16C:
      return FloatRows<WFormat::kBF16C>(w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
    case WFormat::kQ8_0:
      return QuantRows<WFormat::kQ8_0>(w, row_bytes, row_begin, row_end, x, y, y_stride);
    case WFormat::kQ4_0:
      return QuantRows<WFormat::kQ4_0>(w, row_bytes, row_begin, row_end, x, y, y_stride);
  }
}

struct Vec {
  using T = __m512;
  static constexpr int64_t kLanes = 16;
  static T Zero() { return _mm512_setzero_ps(); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T Set1(float v) { return _mm512_set1_ps(v); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(T v) { return HSum(v); }
};

#include "kernels/cpu/attention_isa_impl.h"

#if !defined(MOETIER_KERNEL_AMX)  // the AMX level adds its tiles (matmul_amx_impl.h)
const Kernels kKernels = {kQ4Group,     0,       TokenBytes, Prepare, DotRows, attn::Scores,
                          attn::Values, nullptr, nullptr};
#endif

}  // namespace
}  // namespace moetier::kernels::isa
