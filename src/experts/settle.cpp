#include "experts/settle.h"

#include <cstdlib>
#include <sstream>

namespace moetier {

namespace {

void ParseLayers(const std::string& list, bool& all, std::set<int64_t>& layers) {
  if (list == "all") {
    all = true;
    return;
  }
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) layers.insert(std::strtoll(item.c_str(), nullptr, 10));
}

}  // namespace

FailureInjection FailureInjectionFromEnv() {
  FailureInjection f;
  const char* v = std::getenv("MOETIER_INJECT_FAILURES");
  if (v == nullptr) return f;
  std::stringstream ss(v);
  std::string part;
  while (std::getline(ss, part, ';')) {
    const size_t eq = part.find('=');
    if (eq == std::string::npos) continue;
    const std::string what = part.substr(0, eq), list = part.substr(eq + 1);
    if (what == "pin") ParseLayers(list, f.pin_all, f.pin_layers);
    if (what == "lock") ParseLayers(list, f.lock_all, f.lock_layers);
  }
  return f;
}

SettleResult SettleBank(HostBank& bank, int64_t layer, Tier planned, bool gpu_available,
                        const FailureInjection& inject) {
  const std::string name = "layer " + std::to_string(layer);
  SettleResult r;
  std::string why_not_pinned;
  if (planned == Tier::kPinned) {
    if (!gpu_available) {
      why_not_pinned = "no GPU";
    } else if (inject.FailPin(layer)) {
      why_not_pinned = "injected pin failure";
    } else {
      Status s = bank.Pin();
      if (s.ok()) {
        r.tier = Tier::kPinned;
        return r;
      }
      why_not_pinned = s.message();
    }
  }
  if (planned == Tier::kPinned || planned == Tier::kLocked) {
    Status s = inject.FailLock(layer) ? Status::Error("injected lock failure") : bank.Lock();
    if (s.ok()) {
      r.tier = Tier::kLocked;
      if (!why_not_pinned.empty())
        r.warning = name + ": not pinned (" + why_not_pinned + "); locked, served by the CPU";
      return r;
    }
    r.tier = Tier::kPageable;
    r.warning = name + ": " +
                (why_not_pinned.empty() ? "" : "not pinned (" + why_not_pinned + "), ") +
                "not locked (" + s.message() + "); pageable, served by the CPU";
    return r;
  }
  r.tier = Tier::kPageable;
  return r;
}

}  // namespace moetier
