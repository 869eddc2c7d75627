// BF16C: bf16 weights packed losslessly into 12 bits a weight (plus a 64-byte row header), so a
// memory-bound decode streams ~77 % of bf16's bytes and computes with the very same values.
// Math only: no model knowledge.
//
// Why it works: a bf16 is a sign, 8 exponent bits and 7 mantissa bits. Its low byte (the
// exponent's last bit and the mantissa) is kept as it is; its high byte (sign and the exponent's
// top 7 bits) takes few values in a weight row: weights cluster within a few binades of their
// scale, and the 16 most common high bytes cover 16 binades of either sign. Each weight stores a
// 4-bit code into the row's table of those 16 high bytes; the rare weight whose high byte is not
// in the table (tiny values, outliers, zeros of a row with few of them, inf/NaN) is an
// exception stored whole in the row header, up to kBf16cMaxExceptions a row. Byte layout and
// slot order: matmul_isa.h ("BF16C").
//
// Decoding is a table lookup (vpshufb) and two byte interleaves per 32 weights, cheap next to
// streaming the bytes from DRAM. Rows need a length that is a multiple of 32 and at most
// kBf16cMaxRowElements (core/dtype.h: IsValidRowLength).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul_isa.h"

namespace moetier::kernels {

inline constexpr int kBf16cMaxExceptions = isa::kBf16cMaxExceptions;

// Packs one row of k bf16 values (`bits`, k a multiple of 32, 0 < k <= kBf16cMaxRowElements)
// into DTypeRowBytes(kBF16C, k) bytes at `out`. The table holds the 16 most frequent high bytes
// (ties to the smaller value; unused entries 0), so the exceptions are as few as any table
// allows. Returns the row's number of exceptions, or -1 (and `out` is unspecified) when it would
// need more than kBf16cMaxExceptions: such a row cannot be stored as BF16C.
int PackRowBf16c(const uint16_t* bits, int64_t k, uint8_t* out);

// Packs rows [0, n_rows) of k bf16 values (row stride k) into consecutive packed rows at `out`.
// Returns the first row that cannot be packed (later rows are then not written), or -1.
int64_t PackRowsBf16c(const uint16_t* bits, int64_t n_rows, int64_t k, uint8_t* out);

// The exact inverse: the k bf16 values of a packed row.
void UnpackRowBf16c(const uint8_t* row, int64_t k, uint16_t* bits);

// Exceptions of the row with the most of them among `n_rows` rows of k bf16 values (row stride
// k), or -1 if a row has more than kBf16cMaxExceptions. For checks before a conversion.
int MaxBf16cExceptions(const uint16_t* bits, int64_t n_rows, int64_t k);

}  // namespace moetier::kernels
