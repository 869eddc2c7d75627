// Memory tiers of expert banks (DESIGN.md, "Tiers and execution sites").
#pragma once

#include <optional>
#include <string_view>

namespace moetier {

enum class Tier {
  kGpu,       // copied to VRAM at load (--moe-backend gpu)
  kPinned,    // page-locked and registered with CUDA: the GPU can DMA from it
  kLocked,    // mlock'ed: resident, CPU-only, costs no pin quota
  kPageable,  // plain memory the OS may evict: the last resort, always reported
};

constexpr std::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kGpu:
      return "gpu";
    case Tier::kPinned:
      return "pinned";
    case Tier::kLocked:
      return "locked";
    case Tier::kPageable:
      return "pageable";
  }
  return "?";
}

inline std::optional<Tier> TierFromName(std::string_view s) {
  for (Tier t : {Tier::kGpu, Tier::kPinned, Tier::kLocked, Tier::kPageable})
    if (TierName(t) == s) return t;
  return std::nullopt;
}

}  // namespace moetier
