#include "experts/weight_packing.h"

namespace moetier {

Expected<WeightPacking> ParseWeightPacking(const std::string& text) {
  for (WeightPacking p : {WeightPacking::kAuto, WeightPacking::kNone, WeightPacking::kBf16c})
    if (text == WeightPackingName(p)) return p;
  return Status::Error("--weight-packing: '" + text + "' is not one of auto, none, bf16c");
}

std::string_view WeightPackingName(WeightPacking p) {
  switch (p) {
    case WeightPacking::kAuto:
      return "auto";
    case WeightPacking::kNone:
      return "none";
    case WeightPacking::kBf16c:
      return "bf16c";
  }
  return "?";
}

DType CpuMatrixDType(DType stored, int64_t row_elements, WeightPacking packing) {
  if (packing == WeightPacking::kNone || stored != DType::kBF16 ||
      !IsValidRowLength(DType::kBF16C, row_elements))
    return stored;
  const uint64_t packed = DTypeRowBytes(DType::kBF16C, row_elements);
  const uint64_t as_stored = DTypeRowBytes(DType::kBF16, row_elements);
  if (packing == WeightPacking::kBf16c)  // as `convert --dense-dtype bf16c`: never larger
    return packed < as_stored ? DType::kBF16C : stored;
  const double saved = 1.0 - static_cast<double>(packed) / static_cast<double>(as_stored);
  return saved >= kMinPackingSaving ? DType::kBF16C : stored;
}

Expected<DType> CpuExpertDType(const ExpertLayout& stored, WeightPacking packing) {
  // Gate/up rows have d_model weights, down rows width: both must pack, or neither does.
  const bool fits = stored.dtype == DType::kBF16 &&
                    IsValidRowLength(DType::kBF16C, stored.d_model) &&
                    IsValidRowLength(DType::kBF16C, stored.width);
  // bf16c: as `convert --dtype bf16c`, whatever it saves (the user asked).
  if (packing == WeightPacking::kBf16c && fits) return DType::kBF16C;
  const DType a = CpuMatrixDType(stored.dtype, stored.d_model, packing);
  const DType b = CpuMatrixDType(stored.dtype, stored.width, packing);
  if (a == b && a != stored.dtype) return a;
  if (packing == WeightPacking::kBf16c && stored.dtype != DType::kBF16C) {
    const std::string why =
        stored.dtype == DType::kBF16
            ? "bf16 with rows of " + std::to_string(stored.d_model) + " and " +
                  std::to_string(stored.width) + " weights (bf16c needs multiples of 32, at most " +
                  std::to_string(kBf16cMaxRowElements) + ")"
            : std::string(DTypeName(stored.dtype)) + " (only bf16 experts pack)";
    return Status::Error("--weight-packing bf16c: the experts are " + why +
                         "; use --weight-packing auto or none");
  }
  return stored.dtype;
}

}  // namespace moetier
