// Weight packing: the format a weight matrix is held in while the CPU computes with it, which
// need not be the format it is stored in. bf16 matrices are packed losslessly into BF16C at load
// (kernels/cpu/bf16c.h): the same values in ~77 % of the bytes, so a decode bound by memory
// bandwidth streams fewer bytes per token and the lock budget holds more layers.
//
// What is packed: the experts of CPU-run tiers (locked, pageable) — banks pinned for the GPU keep
// the stored format, the one the device computes with, unless PlanInputs::pack_pinned holds them
// packed too (the GPU expands them after each copy) — and, with the cpu backend, the dense
// matrices but the routers (model/dense_holding.h).
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "experts/expert_layout.h"
#include "experts/tier.h"

namespace moetier {

enum class WeightPacking {
  kAuto,   // pack what packs losslessly and pays: bf16 -> bf16c (the default)
  kNone,   // hold every bank as stored
  kBf16c,  // every bf16 expert whose rows fit, whatever it saves, and every dense matrix it
           // shrinks: as `convert --dtype bf16c --dense-dtype bf16c`; an error if the experts
           // are not bf16 (so a request is never silently ignored)
};

// Parses --weight-packing (auto | none | bf16c); the error names the flag.
Expected<WeightPacking> ParseWeightPacking(const std::string& text);
std::string_view WeightPackingName(WeightPacking p);

// An expert is packed by `auto` only if that saves at least this share of its bytes. BF16C's
// 64-byte row header makes short rows larger (rows of <= 128 weights do not shrink at all); a
// saving of a few percent does not repay the decode's table lookups on a machine that is not
// bandwidth-bound. Real MoE experts save 20-23 % (rows of 768-7168 weights).
inline constexpr double kMinPackingSaving = 0.10;

// The heuristic for one matrix with rows of `row_elements` weights, stored as `stored`: the
// dtype it is held in for the CPU. auto: bf16 -> bf16c when the rows fit BF16C (whole 32-blocks,
// at most kBf16cMaxRowElements) and that saves kMinPackingSaving of the bytes; bf16c: whenever
// the rows fit and shrink at all (as `convert --dense-dtype bf16c`); otherwise, and for every
// other dtype, as stored. Serves the dense matrices.
DType CpuMatrixDType(DType stored, int64_t row_elements, WeightPacking packing);

// The heuristic: the dtype in which experts stored as `stored` are held for the CPU executor.
// auto: bf16 -> bf16c when both row lengths fit BF16C (whole 32-blocks, at most
// kBf16cMaxRowElements) and that saves kMinPackingSaving of the bytes; everything else as
// stored (q8_0 / q4_0 are already compact, and BF16C's tables only pay on 16-bit floats).
// bf16c: whenever the rows fit, whatever it saves, as `convert --dtype bf16c` (the user's
// override; an error when they do not fit or the experts are not bf16). none: as stored.
Expected<DType> CpuExpertDType(const ExpertLayout& stored, WeightPacking packing);

// Tiers whose banks the CPU executor reads (and so may be packed).
constexpr bool IsCpuTier(Tier t) {
  return t == Tier::kLocked || t == Tier::kPageable;
}

}  // namespace moetier
