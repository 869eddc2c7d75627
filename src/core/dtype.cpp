#include "core/dtype.h"

#include <cmath>

namespace moetier {

namespace {
struct NamedDType {
  std::string_view name;
  DType dtype;
};
constexpr NamedDType kNames[] = {
    {"F32", DType::kF32}, {"F16", DType::kF16},   {"BF16", DType::kBF16}, {"F64", DType::kF64},
    {"I64", DType::kI64}, {"I32", DType::kI32},   {"I16", DType::kI16},   {"I8", DType::kI8},
    {"U8", DType::kU8},   {"BOOL", DType::kBool},
};
// Not in kNames: safetensors has no such dtypes, so DTypeFromSafetensorsName must refuse them.
constexpr NamedDType kBlockNames[] = {
    {"Q8_0", DType::kQ8_0}, {"Q4_0", DType::kQ4_0}, {"BF16C", DType::kBF16C}};
}  // namespace

std::string_view DTypeName(DType t) {
  for (const auto& n : kNames)
    if (n.dtype == t) return n.name;
  for (const auto& n : kBlockNames)
    if (n.dtype == t) return n.name;
  return "?";
}

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const auto& n : kNames)
    if (n.name == name) return n.dtype;
  return std::nullopt;
}

std::optional<DType> DTypeFromName(std::string_view name) {
  if (auto d = DTypeFromSafetensorsName(name)) return d;
  for (const auto& n : kBlockNames)
    if (n.name == name) return n.dtype;
  return std::nullopt;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN / inf
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds past the largest half: inf
  if (abs < 0x38800000u) {                       // below the smallest normal half: subnormal
    // value = abs_float * 2^24 in units of the smallest subnormal, rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t half = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: fine
  return sign | static_cast<uint16_t>(half);
}

}  // namespace moetier
