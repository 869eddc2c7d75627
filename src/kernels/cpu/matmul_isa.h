// Internal: the interface between the dispatcher (matmul.cpp) and each instruction set's
// translation unit (matmul_<isa>.cpp, compiled with that ISA's -m flags).
//
// ODR hazard: a TU compiled with -mavx512f must not emit any inline function or template that
// another TU also emits (std:: templates, inline helpers from core/), because the linker keeps
// one copy, which could then run AVX-512 on a CPU without it. So this header uses plain types
// only (its functions are `static`: one private copy per TU), the ISA TUs include nothing but
// <immintrin.h>, <cstdint>, <cstddef>, <cstring> (builtins) and this header, and keep all their
// helpers in an anonymous namespace.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moetier::kernels::isa {

enum class WFormat : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kBF16C };

inline constexpr int64_t kBlock = 32;       // quantized block: weights per block
inline constexpr int64_t kQ8_0Bytes = 34;   // fp16 d + 32 x int8
inline constexpr int64_t kQ4_0Bytes = 18;   // fp16 d + 16 x (2 x 4-bit)
inline constexpr int64_t kAlign = 64;       // bytes; every prepared array starts on a cache line
inline constexpr int64_t kMaxTileRows = 4;  // most weight rows any kernel converts at once

static constexpr int64_t RoundUp(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// BF16C, bf16 packed losslessly (the format and its encoder: bf16c.h; the same numbers as
// core/dtype.h's, which this header cannot include). A row of k weights (k a multiple of 32):
//   header, 64 bytes: table[16]   code c -> the high byte of a bf16 (sign, top 7 exponent bits)
//                     12 x {uint16 element index, uint16 bf16 bits}: the exceptions, weights
//                     whose high byte is not in the table, ascending; unused: index 0xFFFF
//   k/32 blocks, 48 bytes each: lo[32]    the bf16 low bytes, in slot order
//                               code[16]  byte j: slot j's code (low nibble), slot 16+j's (high)
// Weight j of a block sits in slot Bf16cSlot(j): the order in which AVX2's in-lane byte and
// word unpacks (matmul_avx2_impl.h) leave elements 8a..8a+7 in the a-th vector. An exception's
// slot holds code 0 and lo 0; decoders overwrite it with the header's bits.
inline constexpr int64_t kBf16cHeader = 64;
inline constexpr int64_t kBf16cBlock = 48;
inline constexpr int64_t kBf16cExceptionsAt = 16;  // byte offset of the exception list
inline constexpr int kBf16cMaxExceptions = 12;
inline constexpr uint16_t kBf16cNone = 0xFFFF;
static constexpr int Bf16cSlot(int j) {
  const int a = j / 8, d = j % 8;
  return 16 * (d / 4) + 8 * (a / 2) + 2 * (d % 4) + a % 2;
}
static inline uint16_t Bf16cLoad16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
// The bf16 bits the blocks give element i of a row (an exception's come from the header).
static inline uint16_t Bf16cStoredBits(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + kBf16cHeader + i / kBlock * kBf16cBlock;
  const int s = Bf16cSlot(static_cast<int>(i % kBlock));
  const int code = s < 16 ? blk[32 + s] & 15 : blk[32 + s - 16] >> 4;
  return static_cast<uint16_t>((row[code] << 8) | blk[s]);
}
// Writes a row's exceptions over its decoded weights: bf16 bits into `bits`, or (the float
// overload) float32 into `out`. Indices >= k are ignored, so no row's bytes can make a decoder
// write past its output.
static inline void Bf16cApplyExceptions(const uint8_t* row, int64_t k, uint16_t* bits) {
  for (int e = 0; e < kBf16cMaxExceptions; ++e) {
    const uint8_t* x = row + kBf16cExceptionsAt + 4 * e;
    const uint16_t at = Bf16cLoad16(x);
    if (at < k) bits[at] = Bf16cLoad16(x + 2);
  }
}
static inline void Bf16cApplyExceptions(const uint8_t* row, int64_t k, float* out) {
  for (int e = 0; e < kBf16cMaxExceptions; ++e) {
    const uint8_t* x = row + kBf16cExceptionsAt + 4 * e;
    const uint16_t at = Bf16cLoad16(x);
    if (at >= k) continue;
    const uint32_t bits = static_cast<uint32_t>(Bf16cLoad16(x + 2)) << 16;
    __builtin_memcpy(out + at, &bits, 4);
  }
}
// Exact decode of a BF16C row to float32 (the scalar definition every kernel matches).
static inline void Bf16cRowToF32(const uint8_t* row, int64_t k, float* out) {
  for (int64_t i = 0; i < k; ++i) {
    const uint32_t bits = static_cast<uint32_t>(Bf16cStoredBits(row, i)) << 16;
    __builtin_memcpy(out + i, &bits, 4);
  }
  Bf16cApplyExceptions(row, k, out);
}

// Prepared activations, one layout per (weight format, ISA), built once per matmul.
//
// f32/f16/bf16 weights, fp32 math: `x` is the caller's [n_tokens, k] (row stride k); no copy.
// bf16 weights on kAvx512Bf16 (vdpbf16ps): per token, bf16[RoundUp(k, 32)], zero padded.
// Q8_0/Q4_0 weights: per token a record of three arrays (QuantLayout), each kAlign-aligned:
//   qx   int8      the activations as round-half-even(x / dx) per 32-block, in [-127, 127]
//   dx   float     per int32 lane: the scale (max|x| / 127) of the block the lane belongs to
//   bias int32     per int32 lane: -offset * (sum of the lane's quants), added to (or
//                  pre-loaded into) the integer dot so that a kernel which adds `offset` to the
//                  weight codes (unsigned for vpdpbusd/vpmaddubsw) still gets the signed dot.
//                  offset is 8 for Q4_0, 128 for Q8_0 with VNNI, 0 otherwise.
// A "lane" is one int32 of the integer dot. Blocks come in groups of `group`:
//   group 1 (natural order): qx is x's order; 8 lanes per block, lane j = elements 4j..4j+3.
//   group G > 1 (Q4_0 only, "nibble-interleaved", matching how a register holds the low and
//   high nibbles of G blocks): per group, the first 16 quants of each of the G blocks, then the
//   last 16 of each; 4 lanes per block, lane j = elements 4j..4j+3 and 16+4j..16+4j+3.
//   summed lanes (run R > 0; AVX2 Q4_0, R = 8): qx as group 2, but one lane per block, holding
//   the dot of the whole block. Blocks come in runs of R whose lanes are ordered even blocks
//   first, then odd ([b0 b2 b4 b6 | b1 b3 b5 b7] for R = 8): the order in which horizontal adds
//   combine R / 2 two-block steps into one vector, so one float update serves R blocks.
// A last partial group (or run) is padded with zero blocks (zero quants, scale and bias), so
// kernels may process whole groups: the padding adds exactly zero.
struct Prepared {
  int64_t n_tokens = 0;
  int64_t k = 0;
  const float* x = nullptr;       // fp32-math float formats
  const uint8_t* data = nullptr;  // everything else: n_tokens records of token_bytes
  int64_t token_bytes = 0;
  int64_t group = 1;  // quantized formats: blocks per group of the layout
  int64_t run = 0;    // quantized formats: blocks per run of summed lanes (0: per-element lanes)
  // Bytes ahead of a one-token float-format stream (bf16/f16/f32 weights) that AVX2 decode
  // prefetches: the dispatcher's FloatStreamPrefetchBytes().
  int64_t float_prefetch_bytes = 2048;
  // How the fp32 tiles read bf16/f16/bf16c rows in a batch of more tokens than one tile holds
  // (and in any BF16C batch they run): converted to float32 once, every tile reading the copy
  // (true), or converted in registers by each tile, BF16C rows first expanded to bf16 (false).
  // The same results either way; the dispatcher's ConvertBatchRows() picks the faster.
  bool convert_batch_rows = true;
  // Bytes ahead of a one-token quantized stream (q8_0/q4_0 weights) that decode prefetches; 0:
  // the level's own default. A value read at run time on purpose: with a compile-time distance
  // GCC addressed the weight loads from the prefetch pointer (4 KB ahead, another page), and
  // that code streamed q4_0 at 13-15 GB/s instead of 20-22 on one Zen 5 core in about half of
  // the processes started (see QuantStreamPrefetchBytes in matmul.h).
  int64_t quant_prefetch_bytes = 0;
  // Tile-ready copy of the same activations (the AMX level, AmxLayout below), or null. Built by
  // Kernels::pack after the records above; when set, dot_rows reads only this.
  const uint8_t* packed = nullptr;
};

// The AMX level's packed activations: token tiles of 16 tokens (the last one may hold fewer,
// n), each a run of "chunks" along k, every chunk ready for tile loads with a row stride of
// 4n bytes (one int32 / bf16 pair per token):
//   Q8_0: chunk = one 32-block: B tile [8 rows][n tokens x 4 int8] (row q holds quants 4q..4q+3
//         of each token, the VNNI order tdpbssd reads), then float dx[n] (each token's scale).
//   BF16: chunk = 32 elements: three B tiles [16 rows][n tokens x 2 bf16] (row p holds elements
//         2p, 2p+1 of each token), for x's high, middle and low bf16 parts (x = hi + mid + lo
//         exactly: each part takes the next 8 significant bits), so the products are exact.
// Token tile j starts at j * AmxTileBytes(f, k, 16).
inline constexpr int64_t kAmxTokens = 16;  // tokens per token tile
static constexpr int64_t AmxChunkBytes(WFormat f, int64_t n) {
  return f == WFormat::kQ8_0 ? 8 * 4 * n + 4 * n : 3 * 16 * 4 * n;
}
static constexpr int64_t AmxTileBytes(WFormat f, int64_t k, int64_t n) {
  return k / 32 * AmxChunkBytes(f, n);
}

// Byte offsets of the arrays inside one quantized token record.
struct QuantLayout {
  int64_t group;            // blocks per group
  int64_t n_groups;         // ceil(k / 32 / group), or whole runs' worth with summed lanes
  int64_t lanes_per_block;  // 8 (group 1), 4 (group > 1) or 1 (summed lanes)
  int64_t run;              // blocks per run of summed lanes, 0 for per-element lanes
  int64_t dx_offset;
  int64_t bias_offset;
  int64_t token_bytes;
};
static constexpr QuantLayout QuantLayoutFor(int64_t k, int64_t group, int64_t run = 0) {
  const int64_t unit = run > 0 ? run : group;  // the padding unit, in blocks
  const int64_t n_blocks = (k / kBlock + unit - 1) / unit * unit;
  const int64_t lanes_per_block = run > 0 ? 1 : group == 1 ? 8 : 4;
  const int64_t qx_bytes = RoundUp(n_blocks * kBlock, kAlign);
  const int64_t lane_bytes = RoundUp(n_blocks * lanes_per_block * 4, kAlign);
  return {group,    n_blocks / group,      lanes_per_block,          run,
          qx_bytes, qx_bytes + lane_bytes, qx_bytes + 2 * lane_bytes};
}
// Index of block b's first lane in the dx and bias arrays.
static constexpr int64_t FirstLaneOfBlock(const QuantLayout& lay, int64_t b) {
  if (lay.run == 0) return b * lay.lanes_per_block;
  const int64_t j = b % lay.run;
  return b - j + (j % 2) * (lay.run / 2) + j / 2;
}

// One instruction set's kernels. Every function runs on the calling thread.
struct Kernels {
  // Blocks per group, and per run of summed lanes (0: none), in the prepared layout for Q4_0
  // weights (Q8_0 is always group 1, no runs).
  int64_t q4_0_group;
  int64_t q4_0_run;
  // Bytes of prepared data per token (0: the kernel reads the caller's float activations).
  int64_t (*token_bytes)(WFormat f, int64_t k);
  // Writes n_tokens records of token_bytes to `out` (kAlign-aligned) from x [n_tokens, k].
  void (*prepare)(WFormat f, const float* x, int64_t n_tokens, int64_t k, uint8_t* out);
  // y[t * y_stride + r] = dot(x[t], w[r]) for t < x.n_tokens, r in [row_begin, row_end).
  // `w` is row 0; rows are row_bytes apart. `scratch` holds ScratchFloats(k) floats,
  // kAlign-aligned. Each y element's arithmetic is the same whatever the row range and token
  // count, so results never depend on how rows are split across threads.
  void (*dot_rows)(WFormat f, const uint8_t* w, int64_t row_bytes, int64_t row_begin,
                   int64_t row_end, const Prepared& x, float* y, int64_t y_stride, float* scratch);
  // Attention over n_q query heads (rows q_stride apart) that share one key/value head, n_keys
  // positions (rows key_stride / value_stride apart), head size d (any), float32 throughout:
  // scores[g * score_stride + j] = scale * dot(q[g], key[j]); and, given softmaxed p in that
  // layout (rows p_stride apart), out[g * out_stride + i] = sum over j of p[g][j] * value[j][i],
  // the sum continuing from out's values when `accumulate` (a run of keys after another: the
  // keys of a paged cache come in blocks) and from 0 otherwise.
  void (*attn_scores)(const float* q, int64_t n_q, int64_t q_stride, const float* keys,
                      int64_t key_stride, int64_t n_keys, int64_t d, float scale, float* scores,
                      int64_t score_stride);
  void (*attn_values)(const float* p, int64_t n_q, int64_t n_keys, int64_t p_stride,
                      const float* values, int64_t value_stride, int64_t d, float* out,
                      int64_t out_stride, bool accumulate);
  // Tile packing (null when the level has none). packed_bytes: bytes `pack` writes for n_tokens
  // of format f, 0 when f is not packed. pack: writes token tiles [tile_begin, tile_end) of
  // them (tile j = tokens 16j..16j+15, at its offset in `out`, kAlign-aligned) from the
  // records / floats of those tokens in `x`. Distinct tile ranges may be packed concurrently.
  int64_t (*packed_bytes)(WFormat f, int64_t n_tokens, int64_t k);
  void (*pack)(WFormat f, const Prepared& x, int64_t tile_begin, int64_t tile_end, uint8_t* out);
};

static constexpr int64_t ScratchFloats(int64_t k) {
  return kMaxTileRows * RoundUp(k, 64);
}

// BF16C rows [0, n_rows) (row_bytes apart) expanded to plain bf16, row stride k elements,
// exceptions applied: the avx2 level's code, callable once CpuSupports(kAvx2) (another
// architecture's build has a scalar one). The rows are prefetched `ahead` bytes in front of
// the block being read (0: none), short of `stop` (an address: the end of the caller's rows;
// a batch's rows are converted in groups between tiles, so without it each group's first
// reads wait on DRAM).
void Avx2ExpandBf16cRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
                         uint16_t* out, int64_t ahead, uintptr_t stop);
// The same rows decoded to float32 (row stride `stride` floats), exceptions applied: what the
// AVX-512 levels' fp32 tiles read for BF16C batches (same conditions).
void Avx2Bf16cRowsToF32(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                        int64_t stride, int64_t ahead, uintptr_t stop);

// nullptr when the build has no code for that ISA (e.g. not an x86-64 build).
const Kernels* ScalarKernels();
const Kernels* Avx2Kernels();
const Kernels* AvxVnniKernels();
const Kernels* Avx512Kernels();
const Kernels* Avx512VnniKernels();
const Kernels* Avx512Bf16Kernels();
const Kernels* AmxKernels();

}  // namespace moetier::kernels::isa
