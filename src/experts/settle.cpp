#include "experts/settle.h"

#include <charconv>
#include <cstdlib>
#include <sstream>

namespace moetier {

namespace {

constexpr const char* kInjectEnv = "MOETIER_INJECT_FAILURES";

Status InjectError(const std::string& value, const std::string& why) {
  return Status::Error(std::string(kInjectEnv) + "='" + value + "': " + why +
                       "; expected e.g. pin=all, lock=2 or pin=1,3;lock=all");
}

Status ParseLayers(const std::string& value, const std::string& list, bool& all,
                   std::set<int64_t>& layers) {
  if (list == "all") {
    all = true;
    return OkStatus();
  }
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (ec != std::errc() || end != item.data() + item.size() || id < 0)
      return InjectError(value, "'" + item + "' is not a layer id");
    layers.insert(id);
  }
  return OkStatus();
}

}  // namespace

Expected<FailureInjection> ParseFailureInjection(const std::string& value) {
  FailureInjection f;
  std::stringstream ss(value);
  std::string part;
  while (std::getline(ss, part, ';')) {
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    const std::string what = part.substr(0, eq);
    if (eq == std::string::npos || (what != "pin" && what != "lock"))
      return InjectError(value, "'" + part + "' is not pin=... or lock=...");
    const std::string list = part.substr(eq + 1);
    MT_RETURN_IF_ERROR(what == "pin" ? ParseLayers(value, list, f.pin_all, f.pin_layers)
                                     : ParseLayers(value, list, f.lock_all, f.lock_layers));
  }
  return f;
}

Expected<FailureInjection> FailureInjectionFromEnv() {
  const char* v = std::getenv(kInjectEnv);
  return v == nullptr ? FailureInjection{} : ParseFailureInjection(v);
}

SettleResult SettleBank(HostBank& bank, int64_t layer, Tier planned, bool gpu_available,
                        const FailureInjection& inject, const std::string& of) {
  const std::string name = "layer " + std::to_string(layer) + of;
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
