// What residency was planned and what was achieved, as one-line summaries for stderr and as the
// JSON of --report and `moetier plan --json`.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "experts/residency_plan.h"

namespace moetier {

// The dense matrices the CPU streams, as held (model/dense_holding.h): packed as BF16C, copied
// from the file mapping, and the anonymous bytes both take; `memory` is "copy" or "mapped".
struct DenseReport {
  int packed_matrices = 0;
  int copied_matrices = 0;
  uint64_t held_bytes = 0;
  std::string memory;
};

struct ResidencyReport {
  ResidencyPlan plan;
  std::optional<std::vector<LayerResidency>> settled;  // absent for `moetier plan`
  uint64_t vmlck_bytes = 0;                            // /proc/self/status after settling
  std::vector<std::string> warnings;                   // plan and settle warnings
  std::string read_mode;                               // "o_direct", "buffered", "mmap" or ""
  DType stored_dtype = DType::kBF16;  // the experts as stored; held as each layer's dtype says
  std::optional<DenseReport> dense;   // cpu backend, after loading
};

// {"plan":[{"layer":i,"tier":…,"bytes":n,"dtype":…[,"cpu_copy":{"tier":…,"bytes":n,
//  "dtype":…}]}], "settled":[…], "bytes":{"gpu":…,"pinned":…,"locked":…,"pageable":…,
//  "cpu_copies":…}, "stored_dtype":…,
//  "pin_budget_bytes":n|null, "lock_budget_bytes":n|null, "vmlck_bytes":n,
//  "dense":{"memory":…,"packed_matrices":n,"copied_matrices":n,"held_bytes":n} (when loaded
//  with the cpu backend)}
// "bytes" sums the settled tiers' banks when there are any, else the planned ones, and apart
// from them the CPU copies (residency_plan.h) in whatever tier they settled.
nlohmann::ordered_json ResidencyReportJson(const ResidencyReport& r);

// The distinct dtypes of `layers`, in layer order, joined by '+': "BF16C", "BF16C+BF16".
std::string HeldDTypes(const std::vector<LayerResidency>& layers);

// "pinned: 3 layers, 1.21 GB as BF16" for each tier in use (settled if present, else planned),
// then one line for the CPU copies, if any.
std::vector<std::string> TierSummaryLines(const std::vector<LayerResidency>& layers);

}  // namespace moetier
