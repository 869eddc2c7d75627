// AMX tile kernels (AMX-TILE, AMX-INT8, AMX-BF16) for Q8_0 and BF16 weights, included by
// matmul_amx.cpp right after matmul_avx512_impl.h (whose AVX-512 VNNI kernels serve every other
// format, and these two when Prepare did not pack: fewer tokens than PackMinTokens, or k not a
// multiple of 32). Everything here has internal linkage (see the ODR note in matmul_isa.h).
//
// Roles: A = 16 weight rows straight from the weight bytes (tileloadd with the row stride),
// B = 16 tokens of activations packed by Pack (matmul_isa.h, "AMX level"), C = [rows][tokens].
//   Q8_0: per 32-block one tdpbssd gives exact int32 block dots for 16 rows x 16 tokens; they
//         are stored, converted and added as acc += dot * (dx * dw) in fp32, block after block.
//   BF16: x = hi + mid + lo exactly (three bf16 parts), so the bf16 x bf16 products tdpbf16ps
//         forms are exact and it accumulates them in fp32 in its C tile over the whole row.
// Each output element is computed the same way whatever its row block, token tile, row range or
// thread: results do not depend on row splits or on how tokens are batched, as long as the
// batch is packed (the unpacked path below PackMinTokens sums in another order).
//
// Tile registers (the intrinsics need literal numbers):
//   Q8_0: tmm0/tmm3 C (two blocks in flight), tmm1/tmm4 A, tmm2/tmm5 B.
//   BF16: tmm0/tmm1 C of two 16-row blocks, tmm2/tmm3 their A, tmm4/tmm5/tmm6 B (hi, mid, lo).

namespace moetier::kernels::isa {
namespace {

#define MOETIER_AMX_UNROLL _Pragma("GCC unroll 16")

constexpr int64_t kAmxRows = 16;  // weight rows per A tile (the most a tile holds)

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

// Which configuration this thread's tile registers hold (-1: none yet). Tile state is per
// thread and survives context switches, so each shape is loaded once per change of shape.
thread_local int64_t tls_tile_key = -1;

void LoadTileConfig(int64_t key, const TileConfig& cfg) {
  if (tls_tile_key == key) return;
  // Own asm with the whole struct as the operand (GCC 12's _tile_loadconfig names only 8 of
  // its 64 bytes, so stores to the rest could be dropped as dead).
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
  tls_tile_key = key;
}

// ---------------------------------------------------------------------------------------------
// Packing (after Prepare / Gather; token tiles independent of each other).

int64_t PackedBytes(WFormat f, int64_t n_tokens, int64_t k) {
  if ((f != WFormat::kQ8_0 && f != WFormat::kBF16) || k % kBlock != 0 || k == 0) return 0;
  const int64_t full = n_tokens / kAmxTokens, rest = n_tokens % kAmxTokens;
  return full * AmxTileBytes(f, k, kAmxTokens) + AmxTileBytes(f, k, rest);
}

// Byte offsets of 16 tile rows `stride` apart.
inline __m512i RowOffsets(int64_t stride) {
  return _mm512_mullo_epi32(
      _mm512_set1_epi32(static_cast<int>(stride)),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// Q8_0: from the natural-order records (group 1) of the AVX-512 VNNI layout.
void PackQ8(const Prepared& x, int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  const QuantLayout lay = QuantLayoutFor(x.k, 1);
  const int64_t nb = x.k / kBlock;
  for (int64_t t0 = tile_begin * kAmxTokens; t0 < Min(tile_end * kAmxTokens, x.n_tokens);
       t0 += kAmxTokens) {
    const int64_t nt = Min(kAmxTokens, x.n_tokens - t0);
    const int64_t chunk_bytes = AmxChunkBytes(WFormat::kQ8_0, nt);
    uint8_t* tile = out + t0 / kAmxTokens * AmxTileBytes(WFormat::kQ8_0, x.k, kAmxTokens);
    const __m256i rows8 = _mm512_castsi512_si256(RowOffsets(4 * nt));
    for (int64_t n = 0; n < nt; ++n) {
      const uint8_t* rec = x.data + (t0 + n) * x.token_bytes;
      const auto* dx = reinterpret_cast<const float*>(rec + lay.dx_offset);
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* chunk = tile + b * chunk_bytes;
        // Quants 4q..4q+3 of this token's block go to row q, column n.
        const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(rec + b * kBlock));
        _mm256_i32scatter_epi32(chunk + 4 * n, rows8, q, 1);
        reinterpret_cast<float*>(chunk + 8 * 4 * nt)[n] = dx[b * lay.lanes_per_block];
      }
    }
  }
}

// The top 16 bits of 32 floats (v0 = elements 0..15, v1 = 16..31) as 16 dwords, dword p
// holding elements 2p (low half) and 2p + 1.
inline __m512i Bf16Pairs(__m512i v0, __m512i v1) {
  const __m256i a = _mm512_cvtepi32_epi16(_mm512_srli_epi32(v0, 16));
  const __m256i b = _mm512_cvtepi32_epi16(_mm512_srli_epi32(v1, 16));
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// BF16: from the float activations. Truncating to the top 16 bits three times splits a float
// exactly: hi keeps its first 8 significant bits, the remainder x - hi (exact in fp32) has at
// most 16, mid keeps 8 of those, and lo = the last <= 8 bits, which bf16 holds exactly.
void PackBf16(const Prepared& x, int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  const int64_t k = x.k;
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t t0 = tile_begin * kAmxTokens; t0 < Min(tile_end * kAmxTokens, x.n_tokens);
       t0 += kAmxTokens) {
    const int64_t nt = Min(kAmxTokens, x.n_tokens - t0);
    const int64_t chunk_bytes = AmxChunkBytes(WFormat::kBF16, nt), part_bytes = 16 * 4 * nt;
    uint8_t* tile = out + t0 / kAmxTokens * AmxTileBytes(WFormat::kBF16, k, kAmxTokens);
    const __m512i rows16 = RowOffsets(4 * nt);
    for (int64_t n = 0; n < nt; ++n) {
      const float* xt = x.x + (t0 + n) * k;
      for (int64_t c = 0; c < k / 32; ++c) {
        uint8_t* chunk = tile + c * chunk_bytes + 4 * n;
        __m512i v[2], parts[3][2];
        v[0] = _mm512_castps_si512(_mm512_loadu_ps(xt + 32 * c));
        v[1] = _mm512_castps_si512(_mm512_loadu_ps(xt + 32 * c + 16));
        for (int h = 0; h < 2; ++h) {
          const __m512i hi = _mm512_and_si512(v[h], top);
          const __m512 r1 = _mm512_sub_ps(_mm512_castsi512_ps(v[h]), _mm512_castsi512_ps(hi));
          const __m512i mid = _mm512_and_si512(_mm512_castps_si512(r1), top);
          const __m512 r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(mid));
          parts[0][h] = hi;
          parts[1][h] = mid;
          parts[2][h] = _mm512_castps_si512(r2);
        }
        for (int p = 0; p < 3; ++p)
          _mm512_i32scatter_epi32(chunk + p * part_bytes, rows16,
                                  Bf16Pairs(parts[p][0], parts[p][1]), 1);
      }
    }
  }
}

void Pack(WFormat f, const Prepared& x, int64_t tile_begin, int64_t tile_end, uint8_t* out) {
  if (f == WFormat::kQ8_0) return PackQ8(x, tile_begin, tile_end, out);
  if (f == WFormat::kBF16) return PackBf16(x, tile_begin, tile_end, out);
}

// Writes the first nr rows x nt tokens of c[row][token] (row stride 16) to y.
inline void StoreRowsTokens(const float* c, int64_t nr, int64_t nt, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t t = 0; t < nt; ++t) y[t * y_stride + r] = c[r * kAmxTokens + t];
}

// An A tile reads 16 rows at one offset, row_bytes apart: 4 KB rows (bf16, k = 2048) all fall in
// one L1 set, more rows than its ways, so lines prefetched to L1 would be evicted before use.
// The rows' lines are prefetched to L2 instead, kAmxAheadBytes ahead along each row, and past a
// row's end as far along the same row of the next block of `block_rows` (rows are contiguous),
// as the AVX-512 tiles' TileAhead does, unless `last`: the next block is another task's.
constexpr int64_t kAmxAheadBytes = 1024;

inline void PrefetchRowsL2(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t offset,
                           int64_t block_rows, bool last) {
  const bool wrap = offset + kAmxAheadBytes >= row_bytes;
  if (wrap && last) return;
  const int64_t at = offset + kAmxAheadBytes + (wrap ? (block_rows - 1) * row_bytes : 0);
  // Through an integer and inline asm, as Prefetch in matmul_avx512_impl.h (may lie past the
  // weights; never faults; not dropped as dead code).
  const auto base = reinterpret_cast<uintptr_t>(w) + static_cast<uintptr_t>(at);
  for (int64_t r = 0; r < n_rows; ++r) {
    const char* a = reinterpret_cast<const char*>(base + static_cast<uintptr_t>(r * row_bytes));
    __asm__ volatile("prefetcht1 %0" : : "m"(*a));
  }
}

// ---------------------------------------------------------------------------------------------
// Q8_0.

void AmxQ8Rows(const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
               const Prepared& x, float* y, int64_t y_stride) {
  const int64_t nb = x.k / kBlock;
  constexpr int64_t kCStride = 4 * kAmxTokens;          // bytes per row of the c buffers
  alignas(64) int32_t c[2][kAmxRows][kAmxTokens] = {};  // block dots, as the C tiles store them
  alignas(64) float dw[kAmxRows];
  alignas(64) float out[kAmxRows][kAmxTokens];
  const __m512i row_offsets = RowOffsets(row_bytes);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kAmxRows) {
    const int64_t nr = Min(kAmxRows, row_end - r0);
    const bool last = r0 + kAmxRows >= row_end;
    const uint8_t* wr = w + r0 * row_bytes;
    const __mmask16 rows_mask = TailMask16(nr);
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kAmxTokens) {
      const int64_t nt = Min(kAmxTokens, x.n_tokens - t0);
      const int64_t chunk_bytes = AmxChunkBytes(WFormat::kQ8_0, nt), stride = 4 * nt;
      TileConfig cfg;
      for (int t = 0; t < 6; t += 3) {  // C, A, B of both blocks in flight
        cfg.rows[t] = cfg.rows[t + 1] = static_cast<uint8_t>(nr);
        cfg.colsb[t] = static_cast<uint16_t>(stride);
        cfg.colsb[t + 1] = kBlock;
        cfg.rows[t + 2] = kBlock / 4;
        cfg.colsb[t + 2] = static_cast<uint16_t>(stride);
      }
      LoadTileConfig(100 + nr * 32 + nt, cfg);
      const uint8_t* tile =
          x.packed + t0 / kAmxTokens * AmxTileBytes(WFormat::kQ8_0, x.k, kAmxTokens);
      const __mmask16 tokens_mask = TailMask16(nt);
      __m512 acc[kAmxRows];
      MOETIER_AMX_UNROLL for (int r = 0; r < kAmxRows; ++r) acc[r] = _mm512_setzero_ps();
      // Block b's dots are in c[slot]: scale and add them (rows past nr and tokens past nt hold
      // stale values and are never stored).
      auto scale_add = [&](int64_t b, int slot) __attribute__((always_inline)) {
        const __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows_mask,
                                                      row_offsets, wr + b * kQ8_0Bytes, 1);
        _mm512_store_ps(dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)));
        const __m512 dx = _mm512_maskz_loadu_ps(
            tokens_mask, reinterpret_cast<const float*>(tile + b * chunk_bytes + 8 * stride));
        MOETIER_AMX_UNROLL for (int r = 0; r < kAmxRows; ++r) {
          const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(c[slot][r]));
          acc[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(dx, _mm512_set1_ps(dw[r])), acc[r]);
        }
      };
      int64_t b = 0;
      for (; b + 2 <= nb; b += 2) {  // two blocks in flight: the tiles of b + 1 overlap b's math
        if (t0 == 0) PrefetchRowsL2(wr, row_bytes, nr, b * kQ8_0Bytes, kAmxRows, last);
        _tile_loadd(1, wr + b * kQ8_0Bytes + 2, row_bytes);
        _tile_loadd(2, tile + b * chunk_bytes, stride);
        _tile_loadd(4, wr + (b + 1) * kQ8_0Bytes + 2, row_bytes);
        _tile_loadd(5, tile + (b + 1) * chunk_bytes, stride);
        _tile_zero(0);
        _tile_zero(3);
        _tile_dpbssd(0, 1, 2);
        _tile_dpbssd(3, 4, 5);
        _tile_stored(0, c[0], kCStride);
        _tile_stored(3, c[1], kCStride);
        scale_add(b, 0);
        scale_add(b + 1, 1);
      }
      if (b < nb) {
        _tile_loadd(1, wr + b * kQ8_0Bytes + 2, row_bytes);
        _tile_loadd(2, tile + b * chunk_bytes, stride);
        _tile_zero(0);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, c[0], kCStride);
        scale_add(b, 0);
      }
      MOETIER_AMX_UNROLL for (int r = 0; r < kAmxRows; ++r) _mm512_store_ps(out[r], acc[r]);
      StoreRowsTokens(&out[0][0], nr, nt, y + t0 * y_stride + r0, y_stride);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// BF16: 32 rows (two A tiles) per pass, so each B tile load serves both.

void AmxBf16Rows(const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
                 const Prepared& x, float* y, int64_t y_stride) {
  const int64_t n_chunks = x.k / 32;
  constexpr int64_t kCStride = 4 * kAmxTokens;
  alignas(64) float c[2][kAmxRows][kAmxTokens];
  for (int64_t r0 = row_begin; r0 < row_end; r0 += 2 * kAmxRows) {
    const int64_t n0 = Min(kAmxRows, row_end - r0);
    const int64_t n1 = Min(kAmxRows, row_end - r0 - n0);  // 0: one block only
    const bool last = r0 + 2 * kAmxRows >= row_end;
    const uint8_t* w0 = w + r0 * row_bytes;
    const uint8_t* w1 = w0 + n0 * row_bytes;
    for (int64_t t0 = 0; t0 < x.n_tokens; t0 += kAmxTokens) {
      const int64_t nt = Min(kAmxTokens, x.n_tokens - t0);
      const int64_t chunk_bytes = AmxChunkBytes(WFormat::kBF16, nt), stride = 4 * nt;
      const int64_t part_bytes = 16 * stride;
      TileConfig cfg;
      cfg.rows[0] = cfg.rows[2] = static_cast<uint8_t>(n0);
      cfg.colsb[0] = static_cast<uint16_t>(stride);
      cfg.colsb[2] = 64;
      if (n1 > 0) {
        cfg.rows[1] = cfg.rows[3] = static_cast<uint8_t>(n1);
        cfg.colsb[1] = static_cast<uint16_t>(stride);
        cfg.colsb[3] = 64;
      }
      for (int t = 4; t <= 6; ++t) cfg.rows[t] = 16, cfg.colsb[t] = static_cast<uint16_t>(stride);
      LoadTileConfig(10000 + (n0 * 32 + n1) * 32 + nt, cfg);
      const uint8_t* tile =
          x.packed + t0 / kAmxTokens * AmxTileBytes(WFormat::kBF16, x.k, kAmxTokens);
      _tile_zero(0);
      if (n1 > 0) _tile_zero(1);
      for (int64_t ch = 0; ch < n_chunks; ++ch) {
        const uint8_t* b = tile + ch * chunk_bytes;
        if (t0 == 0) PrefetchRowsL2(w0, row_bytes, n0 + n1, ch * 64, 2 * kAmxRows, last);
        _tile_loadd(2, w0 + ch * 64, row_bytes);
        _tile_loadd(4, b, stride);
        _tile_loadd(5, b + part_bytes, stride);
        _tile_loadd(6, b + 2 * part_bytes, stride);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(0, 2, 5);
        _tile_dpbf16ps(0, 2, 6);
        if (n1 > 0) {
          _tile_loadd(3, w1 + ch * 64, row_bytes);
          _tile_dpbf16ps(1, 3, 4);
          _tile_dpbf16ps(1, 3, 5);
          _tile_dpbf16ps(1, 3, 6);
        }
      }
      _tile_stored(0, c[0], kCStride);
      if (n1 > 0) _tile_stored(1, c[1], kCStride);
      StoreRowsTokens(&c[0][0][0], n0, nt, y + t0 * y_stride + r0, y_stride);
      if (n1 > 0) StoreRowsTokens(&c[1][0][0], n1, nt, y + t0 * y_stride + r0 + n0, y_stride);
    }
  }
}

void AmxDotRows(WFormat f, const uint8_t* w, int64_t row_bytes, int64_t row_begin, int64_t row_end,
                const Prepared& x, float* y, int64_t y_stride, float* scratch) {
  if (x.packed != nullptr && f == WFormat::kQ8_0)
    return AmxQ8Rows(w, row_bytes, row_begin, row_end, x, y, y_stride);
  if (x.packed != nullptr && f == WFormat::kBF16)
    return AmxBf16Rows(w, row_bytes, row_begin, row_end, x, y, y_stride);
  DotRows(f, w, row_bytes, row_begin, row_end, x, y, y_stride, scratch);
}

#undef MOETIER_AMX_UNROLL

const Kernels kKernels = {kQ4Group,     0,           TokenBytes, Prepare, AmxDotRows, attn::Scores,
                          attn::Values, PackedBytes, Pack};

}  // namespace
}  // namespace moetier::kernels::isa
