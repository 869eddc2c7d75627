// Element types of tensors on disk and in memory, and scalar conversions to float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moetier {

// kQ8_0 and kQ4_0 are GGUF's block-quantized formats, byte for byte (see
// kernels/cpu/quant.h): a row of k elements (k a multiple of 32) is k/32 blocks of 32 weights,
// each block an fp16 scale then the quants. kBF16C is bf16 packed losslessly into 12 bits a
// weight plus a 64-byte row header (kernels/cpu/bf16c.h): the same values as kBF16, ~77 % of
// its bytes. None of the three has a per-element size: use DTypeRowBytes.
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kQ8_0,
  kQ4_0,
  kBF16C,
};

// True for the block-quantized dtypes, whose elements come in blocks of DTypeBlockElements.
constexpr bool IsBlockQuantized(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0;
}

// True for the dtypes whose rows are whole 32-element blocks and that have no per-element size:
// the block-quantized ones and kBF16C.
constexpr bool IsBlockFormat(DType t) {
  return IsBlockQuantized(t) || t == DType::kBF16C;
}

// Bytes of kBF16C's row header (the code table and the exceptions; kernels/cpu/bf16c.h) and of
// each of its 32-weight blocks (32 low bytes + 16 bytes of 4-bit codes).
inline constexpr size_t kBf16cHeaderBytes = 64;
inline constexpr size_t kBf16cBlockBytes = 48;

// Bytes per element; 0 for the block formats, which have none (use DTypeRowBytes).
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kBF16C:
      return 0;
  }
  return 0;
}

// Elements per block: 32 for the block formats, 1 for the others.
constexpr int64_t DTypeBlockElements(DType t) {
  return IsBlockFormat(t) ? 32 : 1;
}

// Bytes per block: GGUF's block_q8_0 is an fp16 scale + 32 int8 (34 bytes), block_q4_0 an fp16
// scale + 16 bytes of 4-bit codes (18 bytes); a kBF16C block 48 (its rows also have a header:
// DTypeRowBytes); DTypeSize for the others.
constexpr size_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return 34;
    case DType::kQ4_0:
      return 18;
    case DType::kBF16C:
      return kBf16cBlockBytes;
    default:
      return DTypeSize(t);
  }
}

// Bytes of a row of n_elements, for every dtype. For the block formats n_elements must be a
// multiple of 32 (a row is whole blocks; callers check with IsValidRowLength).
constexpr size_t DTypeRowBytes(DType t, int64_t n_elements) {
  const size_t blocks =
      static_cast<size_t>(n_elements / DTypeBlockElements(t)) * DTypeBlockBytes(t);
  return t == DType::kBF16C && n_elements > 0 ? kBf16cHeaderBytes + blocks : blocks;
}

// Longest kBF16C row: its exceptions name elements by 16-bit index, 0xFFFF meaning none.
inline constexpr int64_t kBf16cMaxRowElements = 65504;

// True when a row of n_elements can be stored in dtype t (whole blocks for the block formats;
// kBF16C rows also at most kBf16cMaxRowElements long).
constexpr bool IsValidRowLength(DType t, int64_t n_elements) {
  return n_elements >= 0 && n_elements % DTypeBlockElements(t) == 0 &&
         (t != DType::kBF16C || n_elements <= kBf16cMaxRowElements);
}

// The spelling safetensors uses ("BF16", "F32", ...); "Q8_0" and "Q4_0" (GGUF's names) for the
// block-quantized dtypes, "BF16C" for packed bf16.
std::string_view DTypeName(DType t);
// Only the dtypes safetensors has: never a block-quantized one.
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);
// Every name DTypeName gives, block-quantized ones included (for formats of our own, such as the
// bank index, that may hold them).
std::optional<DType> DTypeFromName(std::string_view name);

// True for the dtypes a weight may have (the matmul kernels read each of them directly).
constexpr bool IsWeightDType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || IsBlockFormat(t);
}

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE half to float, exact for every input (subnormals, inf, NaN).
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even float to half (used by tests that build f16 checkpoints).
uint16_t F32ToF16(float f);

}  // namespace moetier
