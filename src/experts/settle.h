// Settling a filled bank to its tier, degrading instead of failing: a pin that fails makes the
// layer `locked`, a lock that fails makes it `pageable`. Without a GPU a planned-pinned layer is
// locked. The settled tier, not the plan, decides where the layer runs.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "core/status.h"
#include "experts/host_bank.h"
#include "experts/tier.h"

namespace moetier {

// Failures to inject, so every degrade path runs on any machine. Tests set
// MOETIER_INJECT_FAILURES, e.g. "pin=all", "pin=1,3;lock=2", "lock=all".
struct FailureInjection {
  bool pin_all = false, lock_all = false;
  std::set<int64_t> pin_layers, lock_layers;
  bool FailPin(int64_t layer) const { return pin_all || pin_layers.count(layer) > 0; }
  bool FailLock(int64_t layer) const { return lock_all || lock_layers.count(layer) > 0; }
};
// Parses MOETIER_INJECT_FAILURES's value; a malformed one is an error naming the variable.
Expected<FailureInjection> ParseFailureInjection(const std::string& value);
Expected<FailureInjection> FailureInjectionFromEnv();

struct SettleResult {
  Tier tier = Tier::kPageable;
  std::string warning;  // empty when the plan was met
};

// `of` names what the bank is in warnings, after "layer N" (a CPU copy: "'s CPU copy").
SettleResult SettleBank(HostBank& bank, int64_t layer, Tier planned, bool gpu_available,
                        const FailureInjection& inject, const std::string& of = "");

}  // namespace moetier
