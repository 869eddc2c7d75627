#include "experts/residency_report.h"

#include <algorithm>
#include <cstdio>

namespace moetier {

namespace {

nlohmann::ordered_json Layers(const std::vector<LayerResidency>& layers) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const auto& l : layers) {
    nlohmann::ordered_json j = {{"layer", l.layer},
                                {"tier", std::string(TierName(l.tier))},
                                {"bytes", l.bytes},
                                {"dtype", std::string(DTypeName(l.dtype))}};
    if (l.has_cpu_copy())
      j["cpu_copy"] = {{"tier", std::string(TierName(l.cpu_copy_tier))},
                       {"bytes", l.cpu_copy_bytes},
                       {"dtype", std::string(DTypeName(l.cpu_copy_dtype))}};
    a.push_back(std::move(j));
  }
  return a;
}

nlohmann::ordered_json OptionalBytes(const std::optional<uint64_t>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

nlohmann::ordered_json ResidencyReportJson(const ResidencyReport& r) {
  nlohmann::ordered_json j;
  j["backend"] = std::string(BackendName(r.plan.backend));
  j["plan"] = Layers(r.plan.layers);
  if (r.settled) j["settled"] = Layers(*r.settled);
  const auto& counted = r.settled ? *r.settled : r.plan.layers;
  uint64_t by_tier[4] = {0, 0, 0, 0}, copies = 0;
  for (const auto& l : counted) {
    by_tier[static_cast<int>(l.tier)] += l.bytes;
    copies += l.cpu_copy_bytes;
  }
  j["bytes"] = {{"gpu", by_tier[static_cast<int>(Tier::kGpu)]},
                {"pinned", by_tier[static_cast<int>(Tier::kPinned)]},
                {"locked", by_tier[static_cast<int>(Tier::kLocked)]},
                {"pageable", by_tier[static_cast<int>(Tier::kPageable)]},
                {"cpu_copies", copies}};
  j["stored_dtype"] = std::string(DTypeName(r.stored_dtype));
  j["pin_budget_bytes"] = OptionalBytes(r.plan.budgets.pin_bytes);
  j["lock_budget_bytes"] = OptionalBytes(r.plan.budgets.lock_bytes);
  j["vmlck_bytes"] = r.vmlck_bytes;
  if (!r.read_mode.empty()) j["read_mode"] = r.read_mode;
  if (r.dense)
    j["dense"] = {{"memory", r.dense->memory},
                  {"packed_matrices", r.dense->packed_matrices},
                  {"copied_matrices", r.dense->copied_matrices},
                  {"held_bytes", r.dense->held_bytes}};
  j["warnings"] = r.warnings;
  return j;
}

std::string HeldDTypes(const std::vector<LayerResidency>& layers) {
  std::vector<DType> held;
  for (const auto& l : layers)
    if (std::find(held.begin(), held.end(), l.dtype) == held.end()) held.push_back(l.dtype);
  std::string s;
  for (DType d : held) {
    if (!s.empty()) s += '+';
    s += DTypeName(d);
  }
  return s;
}

std::vector<std::string> TierSummaryLines(const std::vector<LayerResidency>& layers) {
  std::vector<std::string> lines;
  for (Tier t : {Tier::kGpu, Tier::kPinned, Tier::kLocked, Tier::kPageable}) {
    std::vector<LayerResidency> in_tier;
    uint64_t bytes = 0;
    for (const auto& l : layers)
      if (l.tier == t) {
        in_tier.push_back(l);
        bytes += l.bytes;
      }
    const auto n = static_cast<int64_t>(in_tier.size());
    if (n == 0) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: %lld layer%s, %.2f GB as %s",
                  std::string(TierName(t)).c_str(), static_cast<long long>(n), n == 1 ? "" : "s",
                  static_cast<double>(bytes) / 1e9, HeldDTypes(in_tier).c_str());
    lines.push_back(buf);
  }
  std::vector<LayerResidency> copied;
  uint64_t copy_bytes = 0;
  for (const auto& l : layers)
    if (l.has_cpu_copy()) {
      copied.push_back(l);
      copy_bytes += l.cpu_copy_bytes;
    }
  if (!copied.empty()) {
    std::string held;  // e.g. "locked", or "locked+pageable" where a lock failed
    for (Tier t : {Tier::kLocked, Tier::kPageable}) {
      if (std::none_of(copied.begin(), copied.end(),
                       [&](const LayerResidency& l) { return l.cpu_copy_tier == t; }))
        continue;
      if (!held.empty()) held.push_back('+');
      held.append(TierName(t));
    }
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "pinned layers' CPU copies: %lld layer%s, %.2f GB as %s, %s (the CPU's share "
                  "of hybrid steps reads them)",
                  static_cast<long long>(copied.size()), copied.size() == 1 ? "" : "s",
                  static_cast<double>(copy_bytes) / 1e9,
                  std::string(DTypeName(copied.front().cpu_copy_dtype)).c_str(), held.c_str());
    lines.push_back(buf);
  }
  return lines;
}

}  // namespace moetier
