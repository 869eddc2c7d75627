// AVX2 + FMA + F16C kernels (256-bit), included by matmul_avx2.cpp and, with
// MOETIER_KERNEL_AVXVNNI defined, by matmul_avxvnni.cpp, each compiled with its ISA's -m flags.
// Everything here has internal linkage (see the ODR note in matmul_isa.h).
//
// Arithmetic per output element (row r, token t), the same whatever the tile shape: the k range
// is cut into steps (8 elements for float formats; one Q8_0 block; a run of eight Q4_0 blocks,
// whose exact integer dots are folded into one vector first), step s is added into accumulator
// s mod A of that element (A = kFloatAcc or kQuantAcc: independent FMA chains, so one row
// streams at full speed), then the A accumulators are summed in a fixed tree and the 8 lanes in
// another. A tile of R rows x C tokens only decides which elements share loads, so results
// depend neither on how rows are split across threads nor on how many tokens are batched.
//
// Memory: decode (one token) walks one row at a time, a single sequential stream, and
// prefetches 1-2 KB ahead of it (kPrefetchBytes; float formats Prepared::float_prefetch_bytes);
// interleaving several rows' streams measured far slower on DRAM. Prefill tiles take 1-2 rows x 1-3
// tokens (float) or up to 3 x 3 (quantized) to reuse loads; each row's prefetch runs on into the
// same row of the next tile (TileAhead).
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

constexpr int kFloatAcc = 4;  // FMA latency 4 x 1 chain per step: 4 chains keep one row busy
// One chain per output element for quantized formats: a Q8_0 step (34 weight bytes) costs ~8
// cycles of unpacking and integer dots, twice the FMA latency, so a second chain bought nothing
// in decode, and one leaves registers for 3x3 prefill tiles (9 accumulators + one row's step);
// a Q4_0 run (144 bytes) takes longer still.
constexpr int kQuantAcc = 1;
// How far ahead of the row being read to prefetch: 2 KB for quantized formats and prefill tiles
// (best for quantized decode on both the AMD and the Intel machine measured; 1 KB once left Q4_0
// at ~55 % of the read bandwidth); for float-format decode the dispatcher decides
// (Prepared::float_prefetch_bytes, see FloatStreamPrefetchBytes in matmul.h: 1-4 KB on AMD, 2 KB
// elsewhere).
constexpr int64_t kPrefetchBytes = 2048;

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
// the row or, past its end, as far along row r of the next tile (R - 1 rows further): each row
// stream runs on into the next tile's, whose rows then do not start cold. R == 1: one stream.
template <int R>
inline int64_t TileAhead(int64_t offset, int64_t row_bytes, int64_t ahead) {
  return offset + ahead >= row_bytes ? ahead + (R - 1) * row_bytes : ahead;
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

inline int64_t Min(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// TileOut's output vector (tile_out_impl.h).
struct OutVec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T Zero() { return _mm256_setzero_ps(); }
  static __m256i Lanes() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static T Insert(T held, int lane, float v) {
    const __m256i at = _mm256_cmpeq_epi32(_mm256_set1_epi32(lane), Lanes());
    return _mm256_blendv_ps(held, _mm256_set1_ps(v), _mm256_castsi256_ps(at));
  }
  static void Store(float* y, T held) { _mm256_storeu_ps(y, held); }
  static void StoreFirst(float* y, T held, int n) {
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), Lanes()), held);
  }
};

#include "kernels/cpu/tile_out_impl.h"

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

// `n_tiles` tiles of R rows one after the other (decode runs a whole row range in one call);
// weights are prefetched `ahead` bytes in front of the rows being read, but nothing at or past
// `stop` (an address: the end of a decode call's row range, whose next bytes are another task's).
template <WFormat F, int R, int C>
void FloatTile(const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t y_stride, int64_t n_tiles = 1, int64_t ahead = kPrefetchBytes,
               uintptr_t stop = UINTPTR_MAX) {
  static_assert(kFloatAcc == 4, "the final sum below adds 4 accumulators");
  TileOut<R, C> out(y, y_stride);
  for (int64_t tile = 0; tile < n_tiles; ++tile, w += R * row_bytes, out.NextTile()) {
    __m256 acc[R][C][kFloatAcc];
    MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
        MOETIER_UNROLL for (int a = 0; a < kFloatAcc; ++a) acc[r][c][a] = _mm256_setzero_ps();
    // One step of 8 elements into accumulator a (a compile-time constant after unrolling);
    // `tail` > 0: only that many elements remain, read through zero-padded copies.
    auto step = [&](int64_t i, int a, int64_t tail) __attribute__((always_inline)) {
      __m256 wv[R];
      MOETIER_UNROLL for (int r = 0; r < R; ++r) wv[r] =
          tail ? LoadTail<F>(w + r * row_bytes, i, tail) : Load8<F>(w + r * row_bytes, i);
      MOETIER_UNROLL for (int c = 0; c < C; ++c) {
        const __m256 xv = tail ? LoadTailX(x + c * k + i, tail) : _mm256_loadu_ps(x + c * k + i);
        MOETIER_UNROLL for (int r = 0; r < R; ++r) acc[r][c][a] =
            _mm256_fmadd_ps(wv[r], xv, acc[r][c][a]);
      }
    };
    constexpr int64_t kIter = 8 * kFloatAcc;  // elements per round over the 4 accumulators
    int64_t i = 0;
    for (; i + kIter <= k; i += kIter) {
      const int64_t to = TileAhead<R>(i * ElemBytes<F>(), row_bytes, ahead);
      MOETIER_UNROLL for (int r = 0; r < R; ++r) {
        const uint8_t* read_at = w + r * row_bytes + i * ElemBytes<F>();
        for (int64_t b = 0; b < kIter * ElemBytes<F>(); b += 64) Prefetch(read_at + b, to, stop);
      }
      MOETIER_UNROLL for (int a = 0; a < kFloatAcc; ++a) step(i + 8 * a, a, 0);
    }
    // Fewer than kIter elements left: whole steps continue the cycle at accumulator 0, then the
    // partial step (if any) goes to the next one.
    const int64_t full = (k - i) / 8, tail = (k - i) % 8;
    if (full > 0) step(i, 0, 0);
    if (full > 1) step(i + 8, 1, 0);
    if (full > 2) step(i + 16, 2, 0);
    if (tail > 0) {
      const int64_t at = i + 8 * full;
      if (full == 0) step(at, 0, tail);
      if (full == 1) step(at, 1, tail);
      if (full == 2) step(at, 2, tail);
      if (full == 3) step(at, 3, tail);
    }
    MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c) {
      const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[r][c][0], acc[r][c][1]),
                                     _mm256_add_ps(acc[r][c][2], acc[r][c][3]));
      out.Put(r, c, HSum(s));
    }
  }
  out.Flush();
}

// Converts rows to float32 in `out` (row stride `stride` floats): exact, so a tile over the
// converted rows does the very same arithmetic as one over the originals. Prefetches `ahead`
// bytes in front of its reads (0: none), short of `stop` (see Prefetch): a batch converts a
// group of rows between its tiles, and without it each group's reads wait on DRAM.
template <WFormat F>
void ConvertRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                 int64_t stride, int64_t ahead, uintptr_t stop) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* o = out + r * stride;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      if (ahead > 0 && (i * ElemBytes<F>()) % 64 == 0)
        Prefetch(row + i * ElemBytes<F>(), ahead, stop);
      _mm256_storeu_ps(o + i, Load8<F>(row, i));
    }
    if (i < k) {
      alignas(32) float buf[8];
      _mm256_store_ps(buf, LoadTail<F>(row, i, k - i));
      std::memcpy(o + i, buf, static_cast<size_t>(k - i) * sizeof(float));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// BF16C (matmul_isa.h): a 48-byte block decodes to the same four float vectors a bf16 row's 32
// weights load as (elements 8a..8a+7 in v[a]), so its tiles do bf16's arithmetic exactly.

inline __m256i Bf16cTable(const uint8_t* row) {  // the 16 high bytes, in both lanes
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
}

// The block's weights as stored, as bf16 words (an exception's lanes are patched by
// Bf16cExceptions): codes to high bytes by one table lookup, then bytes to words in-lane. w0 holds
// slots 0..7 | 16..23 and w1 slots 8..15 | 24..31, each word's low half the even slot.
inline void Bf16cWords(__m256i table, const uint8_t* blk, __m256i& w0, __m256i& w1) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
  const __m256i n =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32)));
  // Lane 0: slots 0..15 (low nibbles); lane 1: slots 16..31 (high nibbles).
  const __m256i codes =
      _mm256_and_si256(_mm256_blend_epi32(n, _mm256_srli_epi16(n, 4), 0xF0), _mm256_set1_epi8(15));
  const __m256i hi = _mm256_shuffle_epi8(table, codes);
  w0 = _mm256_unpacklo_epi8(lo, hi);
  w1 = _mm256_unpackhi_epi8(lo, hi);
}

// Vector a (0..3) of a block's floats from its words.
inline __m256 Bf16cVector(__m256i w0, __m256i w1, int a) {
  const __m256i w = a < 2 ? w0 : w1;
  return _mm256_castsi256_ps(
      a % 2 == 0 ? _mm256_slli_epi32(w, 16)
                 : _mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// The block's four float vectors (elements 8a..8a+7 in v[a]), exceptions not applied.
inline void Bf16cDecode(__m256i table, const uint8_t* blk, __m256 v[4]) {
  __m256i w0, w1;
  Bf16cWords(table, blk, w0, w1);
  for (int a = 0; a < 4; ++a) v[a] = Bf16cVector(w0, w1, a);
}

// Walks a row's exception list (ascending) alongside its blocks. A list that is not ascending
// (a damaged file) leaves later entries unapplied: wrong values, never a bad access.
class Bf16cExceptions {
 public:
  Bf16cExceptions(const uint8_t* row, int64_t k) : list_(row + kBf16cExceptionsAt), k_(k) {
    Advance();
  }
  // The block holding the next exception (past the row when none is left).
  int64_t next_block() const { return next_block_; }
  // Overwrites the lanes of block b's exceptions in its decoded vectors.
  void Patch(int64_t b, __m256 v[4]) {
    alignas(32) float f[kBlock];
    for (int a = 0; a < 4; ++a) _mm256_store_ps(f + 8 * a, v[a]);
    while (next_block_ == b) {
      const uint8_t* x = list_ + 4 * e_;
      const uint32_t bits = static_cast<uint32_t>(Bf16cLoad16(x + 2)) << 16;
      std::memcpy(f + Bf16cLoad16(x) % kBlock, &bits, 4);
      ++e_;
      Advance();
    }
    for (int a = 0; a < 4; ++a) v[a] = _mm256_load_ps(f + 8 * a);
  }

 private:
  void Advance() {
    const uint16_t at = e_ < kBf16cMaxExceptions ? Bf16cLoad16(list_ + 4 * e_) : kBf16cNone;
    next_block_ = at < k_ ? at / kBlock : INT64_MAX;
  }
  const uint8_t* list_;
  int64_t k_;
  int e_ = 0;
  int64_t next_block_ = 0;
};

// One BF16C row against C tokens (x: C rows of k), the arithmetic of FloatTile<kBF16, 1, C>
// (block b's four vectors are its steps 4b..4b+3, into accumulators 0..3), so BF16C gives bf16's
// results bit for bit; sums[c] gets token c's. Each block is decoded once for all C tokens.
// Blocks are prefetched `ahead` bytes in front, short of `stop` (see Prefetch); ahead 0: none.
template <int C>
inline void Bf16cRowDots(const uint8_t* row, const float* x, int64_t k, int64_t ahead,
                         uintptr_t stop, float* sums) {
  const __m256i table = Bf16cTable(row);
  Bf16cExceptions ex(row, k);
  __m256 acc[C][4];
  MOETIER_UNROLL for (int c = 0; c < C; ++c) MOETIER_UNROLL for (int a = 0; a < 4; ++a) acc[c][a] =
      _mm256_setzero_ps();
  const uint8_t* blk = row + kBf16cHeader;
  for (int64_t b = 0; b < k / kBlock; ++b, blk += kBf16cBlock) {
    if (ahead > 0) Prefetch(blk, ahead, stop);
    const float* xb = x + b * kBlock;
    if (b == ex.next_block()) [[unlikely]] {
      __m256 v[4];
      Bf16cDecode(table, blk, v);
      ex.Patch(b, v);
      MOETIER_UNROLL for (int c = 0; c < C; ++c) MOETIER_UNROLL for (int a = 0; a < 4; ++a)
          acc[c][a] = _mm256_fmadd_ps(v[a], _mm256_loadu_ps(xb + c * k + 8 * a), acc[c][a]);
      continue;
    }
    // One float vector live at a time: three tokens' 12 accumulators leave four registers, so
    // the accumulators stay in them (a spilled one waits on a store and a load every block).
    __m256i w0, w1;
    Bf16cWords(table, blk, w0, w1);
    MOETIER_UNROLL for (int a = 0; a < 4; ++a) {
      const __m256 v = Bf16cVector(w0, w1, a);
      MOETIER_UNROLL for (int c = 0; c < C; ++c) acc[c][a] =
          _mm256_fmadd_ps(v, _mm256_loadu_ps(xb + c * k + 8 * a), acc[c][a]);
    }
  }
  MOETIER_UNROLL for (int c = 0; c < C; ++c) sums[c] =
      HSum(_mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][1]), _mm256_add_ps(acc[c][2], acc[c][3])));
}

// `n_rows` rows one after the other against C <= 3 tokens, each block decoded once for all.
template <int C>
void Bf16cRows(const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t y_stride, int64_t n_rows, int64_t ahead) {
  static_assert(C >= 1 && C <= 3);
  const uintptr_t stop = reinterpret_cast<uintptr_t>(w + n_rows * row_bytes);  // see Prefetch
  TileOut<1, C> out(y, y_stride);
  for (int64_t r = 0; r < n_rows; ++r, w += row_bytes, out.NextTile()) {
    float sums[C];
    Bf16cRowDots<C>(w, x, k, ahead, stop, sums);
    MOETIER_UNROLL for (int c = 0; c < C; ++c) out.Put(0, c, sums[c]);
  }
  out.Flush();
}

template <>
void ConvertRows<WFormat::kBF16C>(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
                                  float* out, int64_t stride, int64_t ahead, uintptr_t stop) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* o = out + r * stride;
    const __m256i table = Bf16cTable(row);
    for (int64_t b = 0; b < k / kBlock; ++b) {
      if (ahead > 0) Prefetch(row + kBf16cHeader + b * kBf16cBlock, ahead, stop);
      __m256 v[4];
      Bf16cDecode(table, row + kBf16cHeader + b * kBf16cBlock, v);
      for (int a = 0; a < 4; ++a) _mm256_storeu_ps(o + b * kBlock + 8 * a, v[a]);
    }
    Bf16cApplyExceptions(row, k, o);
  }
}

// Rows expanded to plain bf16 (row stride k elements), exceptions applied: for the levels whose
// batched bf16 kernels (AMX tiles, vdpbf16ps) outrun fp32 FMAs on expanded floats.
[[maybe_unused]] void ExpandBf16cRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows,
                                      int64_t k, uint16_t* out, int64_t ahead, uintptr_t stop) {
  // Bf16cWords: elements 0..15 are w0's even words then its odd ones (Bf16cSlot): a byte
  // shuffle gathers [even | odd] in each lane, a qword permute orders the lanes.
  const __m256i even_odd = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                            1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    uint16_t* o = out + r * k;
    const __m256i table = Bf16cTable(row);
    for (int64_t b = 0; b < k / kBlock; ++b) {
      const uint8_t* blk = row + kBf16cHeader + b * kBf16cBlock;
      if (ahead > 0) Prefetch(blk, ahead, stop);
      __m256i w0, w1;
      Bf16cWords(table, blk, w0, w1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + b * kBlock),
                          _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w0, even_odd), 0xD8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + b * kBlock + 16),
                          _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w1, even_odd), 0xD8));
    }
    Bf16cApplyExceptions(row, k, o);
  }
}

// ---------------------------------------------------------------------------------------------
// Q8_0: int8 dots per block (8 int32 lanes), scaled per block in float32.

struct Q8Step {  // one weight row's block, ready for the int8 dots
  __m256i q;     // codes (kVnni: + 128, as uint8)
  __m256i q2;    // without VNNI: |codes|
  __m256 d;      // the block's weight scale in every lane
};

inline Q8Step LoadQ8Step(const uint8_t* blk) {
  Q8Step st;
  uint16_t h;
  std::memcpy(&h, blk, 2);
  st.d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
  st.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  if constexpr (kVnni) {
    st.q = _mm256_xor_si256(st.q, _mm256_set1_epi8(static_cast<char>(0x80)));  // + 128
    st.q2 = st.q;
  } else {
    st.q2 = _mm256_abs_epi8(st.q);
  }
  return st;
}

// int32 lanes of one block's dot with the activation quants at `xq`, plus the prepared bias.
inline __m256i Q8StepDot(const Q8Step& w, const uint8_t* xq, __m256i bias) {
  const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq));
  if constexpr (kVnni) {
#if defined(MOETIER_KERNEL_AVXVNNI)
    return _mm256_dpbusd_avx_epi32(bias, w.q, x0);
#endif
  } else {
    // |w| * (x * sign(w)): pairs stay within int16 (2 * 128 * 127 < 32768); offset 0.
    (void)bias;
    const __m256i p = _mm256_maddubs_epi16(w.q2, _mm256_sign_epi8(x0, w.q));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
}

// `n_tiles` tiles of R rows one after the other (decode runs a whole row range in one call: a
// down-projection row of 768 weights is only ~24 blocks, so a call per row cost ~10 %).
template <int R, int C>
void Q8Tile(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
            int64_t k, float* y, int64_t y_stride, int64_t n_tiles = 1,
            int64_t ahead = kPrefetchBytes) {
  const QuantLayout lay = QuantLayoutFor(k, 1);
  const int64_t nb = k / kBlock;
  static_assert(kQuantAcc == 1, "one accumulator per output element (see kQuantAcc)");
  TileOut<R, C> out(y, y_stride);
  for (int64_t tile = 0; tile < n_tiles; ++tile, w += R * row_bytes, out.NextTile()) {
    __m256 acc[R][C];
    MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_setzero_ps();
    // One block. Row by row, so that only one row's unpacked block is live beside the
    // accumulators (16 ymm registers).
    auto step = [&](int64_t b) __attribute__((always_inline)) {
      MOETIER_UNROLL for (int r = 0; r < R; ++r) {
        const Q8Step ws = LoadQ8Step(w + r * row_bytes + b * kQ8_0Bytes);
        MOETIER_UNROLL for (int c = 0; c < C; ++c) {
          const uint8_t* rec = xrec + c * token_bytes;
          const __m256 dx =
              _mm256_load_ps(reinterpret_cast<const float*>(rec + lay.dx_offset) + 8 * b);
          const __m256i bias =
              _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + lay.bias_offset) + b);
          const __m256 s = _mm256_cvtepi32_ps(Q8StepDot(ws, rec + b * kBlock, bias));
          acc[r][c] = _mm256_fmadd_ps(s, _mm256_mul_ps(ws.d, dx), acc[r][c]);
        }
      }
    };
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {  // two blocks per prefetch: 68 bytes, about a cache line
      const int64_t to = TileAhead<R>(b * kQ8_0Bytes, row_bytes, ahead);
      MOETIER_UNROLL for (int r = 0; r < R; ++r) Prefetch(w + r * row_bytes + b * kQ8_0Bytes, to);
      step(b);
      step(b + 1);
    }
    if (b < nb) step(b);
    MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
        out.Put(r, c, HSum(acc[r][c]));
  }
  out.Flush();
}

// ---------------------------------------------------------------------------------------------
// Q4_0 with summed lanes (matmul_isa.h): a two-block step unpacks the nibbles of two blocks into
// one register ([block 2s | block 2s+1], low nibbles and high nibbles), and four steps' integer
// dots are folded by horizontal adds into one vector holding each of the run's 8 blocks' whole
// dot, so the float work (convert, scale, accumulate) runs once per 8 blocks instead of once
// per 2. Measured against the per-step version: 18.3 -> 23.0 GB/s on one core with the weights
// in L2, +9 % streaming from DRAM on 2 cores (dev machine, AVX2).

constexpr int64_t kQ4Run = 8;                          // blocks per run (lanes per vector)
constexpr int64_t kQ4StepBlocks = 2;                   // blocks per step
constexpr int64_t kQ4RunBytes = kQ4Run * kQ4_0Bytes;   // weight bytes per run (144)
constexpr int64_t kQ4StepQx = kQ4StepBlocks * kBlock;  // activation quants per step (64)
// Prefill tile: rows x tokens (accumulators, one fold per token and two steps' nibbles must fit
// the 16 ymm registers).
constexpr int64_t kQ4TileRows = 3, kQ4TileTokens = 3;

struct Q4Step {
  __m256i lo;  // low nibbles (codes of elements 0..15) of both blocks
  __m256i hi;  // high nibbles (elements 16..31)
};

// Step s of the run at `run`, of which `n_blocks` blocks exist: the others read as zero, never
// from memory (n_blocks is a constant kQ4Run except in a row's last, partial run).
inline Q4Step LoadQ4Step(const uint8_t* run, int s, int64_t n_blocks) {
  const int64_t b = kQ4StepBlocks * s;
  const __m128i q0 =
      b < n_blocks ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(run + b * kQ4_0Bytes + 2))
                   : _mm_setzero_si128();
  const __m128i q1 =
      b + 1 < n_blocks
          ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(run + (b + 1) * kQ4_0Bytes + 2))
          : _mm_setzero_si128();
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
}

// One step's dot with the activation quants at `xq` (low halves of both blocks, then high
// halves), before the codes' offset of 8 is taken off (the bias does that). Without VNNI:
// int16 lanes, each the sum of 4 products of codes 0..15 with int8 in [-127, 127]: |.| <= 7620.
// With VNNI: int32 lanes.
inline __m256i Q4StepDot(const Q4Step& w, const uint8_t* xq) {
  const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + 32));
  if constexpr (kVnni) {
#if defined(MOETIER_KERNEL_AVXVNNI)
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w.lo, x0), w.hi,
                                   x1);
#endif
  } else {
    return _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, x0), _mm256_maddubs_epi16(w.hi, x1));
  }
}

// Adjacent lanes of a and b summed, per 128-bit half: [a0+a1, a2+a3, .., b0+b1, ..]. Without
// VNNI in int16: two folds of step dots reach at most 4 * 7620 = 30480, inside int16.
inline __m256i Q4Fold(__m256i a, __m256i b) {
  return kVnni ? _mm256_hadd_epi32(a, b) : _mm256_hadd_epi16(a, b);
}

// Four steps folded twice, (s0, s1) then (s2, s3), then to int32: lane j of the result is the
// whole dot of block 2j (j < 4) or 2(j - 4) + 1 of the run, the summed-lane order.
inline __m256i Q4RunDot(__m256i folded01, __m256i folded23) {
  const __m256i v = Q4Fold(folded01, folded23);
  return kVnni ? v : _mm256_madd_epi16(v, _mm256_set1_epi16(1));
}

// The fp16 scales of the run's blocks in summed-lane order, missing blocks 0.
inline __m256 Q4RunScales(const uint8_t* run, int64_t n_blocks) {
  uint64_t even = 0, odd = 0;
  MOETIER_UNROLL for (int j = 0; j < kQ4Run; ++j) {
    if (j >= n_blocks) break;
    uint16_t h;
    std::memcpy(&h, run + j * kQ4_0Bytes, 2);
    (j % 2 == 0 ? even : odd) |= static_cast<uint64_t>(h) << (16 * (j / 2));
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<long long>(odd), static_cast<long long>(even)));
}

// `n_tiles` tiles of R rows one after the other. Per output element and run: one float update
// acc += float(dot) * (d * dx) in 8 lanes (one per block), then the 8 lanes summed in a fixed
// tree; the integer dots are exact, so the result does not depend on R, C or the split.
template <int R, int C>
void Q4Tile(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
            int64_t k, float* y, int64_t y_stride, int64_t n_tiles = 1,
            int64_t ahead = kPrefetchBytes) {
  const QuantLayout lay = QuantLayoutFor(k, kQ4StepBlocks, kQ4Run);
  const int64_t nb = k / kBlock;
  TileOut<R, C> out(y, y_stride);
  for (int64_t tile = 0; tile < n_tiles; ++tile, w += R * row_bytes, out.NextTile()) {
    __m256 acc[R][C];
    MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_setzero_ps();
    // Run u, with n_blocks of its blocks present. Row by row, two steps' nibbles at a time, so
    // that the registers hold the accumulators, one partial fold per token and two steps.
    auto run = [&](int64_t u, int64_t n_blocks) __attribute__((always_inline)) {
      MOETIER_UNROLL for (int r = 0; r < R; ++r) {
        const uint8_t* wr = w + r * row_bytes + u * kQ4RunBytes;
        __m256i folded[C];  // steps 0 and 1 folded, then the run's dots
        MOETIER_UNROLL for (int half = 0; half < 2; ++half) {
          const Q4Step s0 = LoadQ4Step(wr, 2 * half, n_blocks);
          const Q4Step s1 = LoadQ4Step(wr, 2 * half + 1, n_blocks);
          MOETIER_UNROLL for (int c = 0; c < C; ++c) {
            const uint8_t* xq = xrec + c * token_bytes + (4 * u + 2 * half) * kQ4StepQx;
            const __m256i f = Q4Fold(Q4StepDot(s0, xq), Q4StepDot(s1, xq + kQ4StepQx));
            folded[c] = half == 0 ? f : Q4RunDot(folded[c], f);
          }
        }
        // The scales are read after the integer work, when fewer registers are live.
        const __m256 d = Q4RunScales(wr, n_blocks);
        MOETIER_UNROLL for (int c = 0; c < C; ++c) {
          const uint8_t* rec = xrec + c * token_bytes;
          const __m256i bias =
              _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + lay.bias_offset) + u);
          const __m256 dx =
              _mm256_load_ps(reinterpret_cast<const float*>(rec + lay.dx_offset) + 8 * u);
          const __m256i dot = _mm256_add_epi32(folded[c], bias);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, dx), acc[r][c]);
        }
      }
    };
    const int64_t n_full = nb / kQ4Run;
    for (int64_t u = 0; u < n_full; ++u) {
      // Two prefetches per run, 72 bytes apart (about a cache line each).
      const int64_t to = TileAhead<R>(u * kQ4RunBytes, row_bytes, ahead);
      MOETIER_UNROLL for (int r = 0; r < R; ++r) {
        Prefetch(w + r * row_bytes + u * kQ4RunBytes, to);
        Prefetch(w + r * row_bytes + u * kQ4RunBytes + kQ4RunBytes / 2, to);
      }
      run(u, kQ4Run);
    }
    if (nb > n_full * kQ4Run) run(n_full, nb - n_full * kQ4Run);
    MOETIER_UNROLL for (int r = 0; r < R; ++r) MOETIER_UNROLL for (int c = 0; c < C; ++c)
        out.Put(r, c, HSum(acc[r][c]));
  }
  out.Flush();
}

// ---------------------------------------------------------------------------------------------
// Row/token blocking: (1 row x 1 token) for decode; up to 1 x 3 (float) or 3 x 3 (quantized)
// tiles otherwise; remainders use smaller instantiations (same per-element arithmetic).

#define MOETIER_TILE_CASES_R(FN, R, ...) \
  case R * 8 + 1:                        \
    FN<R, 1>(__VA_ARGS__);               \
    break;                               \
  case R * 8 + 2:                        \
    FN<R, 2>(__VA_ARGS__);               \
    break;                               \
  case R * 8 + 3:                        \
    FN<R, 3>(__VA_ARGS__);               \
    break;
// Float tiles are one row high; quantized ones up to three.
#define MOETIER_FLOAT_TILE_SWITCH(FN, NR, NT, ...) \
  switch ((NR)*8 + (NT)) {                         \
    MOETIER_TILE_CASES_R(FN, 1, __VA_ARGS__)       \
    default:                                       \
      break;                                       \
  }
#define MOETIER_QUANT_TILE_SWITCH(FN, NR, NT, ...) \
  switch ((NR)*8 + (NT)) {                         \
    MOETIER_TILE_CASES_R(FN, 1, __VA_ARGS__)       \
    MOETIER_TILE_CASES_R(FN, 2, __VA_ARGS__)       \
    MOETIER_TILE_CASES_R(FN, 3, __VA_ARGS__)       \
    default:                                       \
      break;                                       \
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
  // 16 ymm registers: 1 row x 3 tokens x 4 accumulators = 12.
  constexpr int64_t kRows = 1, kTokens = 3;
  const int64_t k = x.k;
  if constexpr (F == WFormat::kBF16C) {
    // Up to a tile's tokens: the whole row range in one call, each block decoded once in
    // registers (converting rows to float32 first reads and writes 4 bytes a weight more).
    if (x.n_tokens <= kTokens) {
      if (row_end <= row_begin) return;
      const uint8_t* rows = w + row_begin * row_bytes;
      const int64_t n = row_end - row_begin, ahead = x.float_prefetch_bytes;
      if (x.n_tokens == 1) Bf16cRows<1>(rows, row_bytes, x.x, k, y + row_begin, 0, n, ahead);
      if (x.n_tokens == 2) Bf16cRows<2>(rows, row_bytes, x.x, k, y + row_begin, y_stride, n, ahead);
      if (x.n_tokens == 3) Bf16cRows<3>(rows, row_bytes, x.x, k, y + row_begin, y_stride, n, ahead);
      return;
    }
  }
  if (x.n_tokens == 1) {  // decode: the whole row range in one call
    if (row_end > row_begin)
      FloatTile<F, 1, 1>(w + row_begin * row_bytes, row_bytes, x.x, k, y + row_begin, y_stride,
                         row_end - row_begin, x.float_prefetch_bytes,
                         reinterpret_cast<uintptr_t>(w + row_end * row_bytes));
    return;
  }
  // More tokens than one tile holds: each row converted to float32 once for every token tile
  // (Prepared::convert_batch_rows), or converted in registers by each tile, a BF16C row
  // expanded to bf16 first; fewer: in registers (BF16C, above, too).
  const bool to_f32 =
      F != WFormat::kF32 && x.convert_batch_rows && (F == WFormat::kBF16C || x.n_tokens > kTokens);
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
      ExpandBf16cRows(w + r0 * row_bytes, row_bytes, nr, k, expanded, x.float_prefetch_bytes, stop);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTokens) {
      const int64_t nt = Min(kTokens, x.n_tokens - t0);
      float* yt = y + t0 * y_stride + r0;
      const float* xt = x.x + t0 * k;
      if (to_f32) {
        const auto* cw = reinterpret_cast<const uint8_t*>(scratch);
        MOETIER_FLOAT_TILE_SWITCH(FloatTiles<WFormat::kF32>::template Run, nr, nt, cw, stride * 4,
                                  xt, k, yt, y_stride)
      } else if (to_bf16) {
        const auto* bw = reinterpret_cast<const uint8_t*>(expanded);
        MOETIER_FLOAT_TILE_SWITCH(FloatTiles<WFormat::kBF16>::template Run, nr, nt, bw, 2 * k, xt,
                                  k, yt, y_stride)
      } else if constexpr (F != WFormat::kBF16C) {
        MOETIER_FLOAT_TILE_SWITCH(FloatTiles<F>::template Run, nr, nt, w + r0 * row_bytes,
                                  row_bytes, xt, k, yt, y_stride)
      }
    }
  }
}

template <WFormat F>
struct QuantTiles {
  template <int R, int C>
  static void Run(const uint8_t* w, int64_t row_bytes, const uint8_t* xrec, int64_t token_bytes,
                  int64_t k, float* y, int64_t y_stride, int64_t n_tiles = 1,
                  int64_t ahead = kPrefetchBytes) {
    if constexpr (F == WFormat::kQ8_0) {
      Q8Tile<R, C>(w, row_bytes, xrec, token_bytes, k, y, y_stride, n_tiles, ahead);
    } else {
      Q4Tile<R, C>(w, row_bytes, xrec, token_bytes, k, y, y_stride, n_tiles, ahead);
    }
  }
};

template <WFormat F>
void QuantRows(const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
               const Prepared& x, float* y, int64_t y_stride) {
  // Decode: one row after the other (one stream), in one call; prefill: R rows x C tokens share
  // their loads (each row's unpacked weights serve C tokens, each token's quants R rows).
  if (x.n_tokens == 1) {
    if (row_end > row_begin)
      // A distance read at run time (Prepared::quant_prefetch_bytes says why).
      QuantTiles<F>::template Run<1, 1>(
          w + row_begin * row_bytes, row_bytes, x.data, x.token_bytes, x.k, y + row_begin, y_stride,
          row_end - row_begin,
          x.quant_prefetch_bytes > 0 ? x.quant_prefetch_bytes : kPrefetchBytes);
    return;
  }
  constexpr int64_t kRows = F == WFormat::kQ8_0 ? 3 : kQ4TileRows;
  constexpr int64_t kTokens = F == WFormat::kQ8_0 ? 3 : kQ4TileTokens;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
    const int64_t nr = Min(kRows, row_end - r0);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kTokens) {
      const int64_t nt = Min(kTokens, x.n_tokens - t0);
      MOETIER_QUANT_TILE_SWITCH(QuantTiles<F>::template Run, nr, nt, w + r0 * row_bytes, row_bytes,
                                x.data + t0 * x.token_bytes, x.token_bytes, x.k,
                                y + t0 * y_stride + r0, y_stride)
    }
  }
}

#undef MOETIER_FLOAT_TILE_SWITCH
#undef MOETIER_QUANT_TILE_SWITCH
#undef MOETIER_TILE_CASES_R
#undef MOETIER_UNROLL

// ---------------------------------------------------------------------------------------------
// Activation quantization, bit-identical to the scalar reference (matmul_scalar.cpp) up to the
// layout: same amax, scale, rounding and clamping.

int64_t TokenBytes(WFormat f, int64_t k) {
  if (f == WFormat::kQ8_0) return QuantLayoutFor(k, 1).token_bytes;
  if (f == WFormat::kQ4_0) return QuantLayoutFor(k, kQ4StepBlocks, kQ4Run).token_bytes;
  return 0;
}

int32_t QuantOffset(WFormat f) {
  if (f == WFormat::kQ4_0) return 8;
  return kVnni ? 128 : 0;
}

// Quantizes one 32-block: returns its 32 quants in natural order and its scale.
inline __m256i QuantizeBlock(const float* x, float* d_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_loadu_ps(x + 8 * j);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 0x55));
  const float amax = _mm_cvtss_f32(m4);
  *d_out = amax / 127.0f;
  const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
  __m256i q[4];
  for (int j = 0; j < 4; ++j)
    q[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[j], id), lo), hi));
  // int32 -> int8 (in range, so saturation never bites), then undo the in-lane interleave.
  const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Sums of 4 consecutive int8 in each int32 lane.
inline __m256i LaneSums(__m256i q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}

// Sum of the 8 int32 lanes.
inline int32_t HSumI(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x55));
  return _mm_cvtsi128_si32(s);
}

void Prepare(WFormat f, const float* x, int64_t n_tokens, int64_t k, uint8_t* out) {
  if (TokenBytes(f, k) == 0) return;
  const bool q4 = f == WFormat::kQ4_0;
  const QuantLayout lay = q4 ? QuantLayoutFor(k, kQ4StepBlocks, kQ4Run) : QuantLayoutFor(k, 1);
  const int64_t nb = k / kBlock;
  const __m256i neg_offset = _mm256_set1_epi32(-QuantOffset(f));
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = out + t * lay.token_bytes;
    std::memset(rec, 0, static_cast<size_t>(lay.token_bytes));
    const float* xt = x + t * k;
    auto* dx = reinterpret_cast<float*>(rec + lay.dx_offset);
    if (!q4) {
      auto* bias = reinterpret_cast<__m256i*>(rec + lay.bias_offset);
      for (int64_t b = 0; b < nb; ++b) {
        float d;
        const __m256i q = QuantizeBlock(xt + b * kBlock, &d);
        _mm256_store_si256(reinterpret_cast<__m256i*>(rec + b * kBlock), q);
        _mm256_store_ps(dx + 8 * b, _mm256_set1_ps(d));
        _mm256_store_si256(bias + b, _mm256_mullo_epi32(LaneSums(q), neg_offset));
      }
      continue;
    }
    // Nibble-interleaved pairs, [b lo16 | b1 lo16] then [b hi16 | b1 hi16]; one lane per block
    // (summed lanes), the padding blocks of the last run left zero.
    auto* bias = reinterpret_cast<int32_t*>(rec + lay.bias_offset);
    for (int64_t b = 0; b < nb; b += 2) {
      float d0 = 0.0f, d1 = 0.0f;
      const __m256i q0 = QuantizeBlock(xt + b * kBlock, &d0);
      const __m256i q1 =
          b + 1 < nb ? QuantizeBlock(xt + (b + 1) * kBlock, &d1) : _mm256_setzero_si256();
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + b * kBlock),
                         _mm256_permute2x128_si256(q0, q1, 0x20));
      _mm256_store_si256(reinterpret_cast<__m256i*>(rec + b * kBlock + 32),
                         _mm256_permute2x128_si256(q0, q1, 0x31));
      dx[FirstLaneOfBlock(lay, b)] = d0;
      bias[FirstLaneOfBlock(lay, b)] = -QuantOffset(f) * HSumI(LaneSums(q0));
      if (b + 1 < nb) {
        dx[FirstLaneOfBlock(lay, b + 1)] = d1;
        bias[FirstLaneOfBlock(lay, b + 1)] = -QuantOffset(f) * HSumI(LaneSums(q1));
      }
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
    case WFormat::kBF16C:
      return FloatRows<WFormat::kBF16C>(w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
    case WFormat::kQ8_0:
      return QuantRows<WFormat::kQ8_0>(w, row_bytes, row_begin, row_end, x, y, y_stride);
    case WFormat::kQ4_0:
      return QuantRows<WFormat::kQ4_0>(w, row_bytes, row_begin, row_end, x, y, y_stride);
  }
}

struct Vec {
  using T = __m256;
  static constexpr int64_t kLanes = 8;
  static T Zero() { return _mm256_setzero_ps(); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T Set1(float v) { return _mm256_set1_ps(v); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(T v) { return HSum(v); }
};

#include "kernels/cpu/attention_isa_impl.h"

const Kernels kKernels = {kQ4StepBlocks, kQ4Run,       TokenBytes, Prepare, DotRows,
                          attn::Scores,  attn::Values, nullptr,    nullptr};

}  // namespace
}  // namespace moetier::kernels::isa
