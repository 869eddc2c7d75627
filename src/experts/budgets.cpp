#include "experts/budgets.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace moetier {

namespace {

Expected<std::optional<double>> EnvGb(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<double>{};
  char* end = nullptr;
  const double gb = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(gb) || gb < 0)
    return Status::Error(std::string(name) + ": '" + v +
                         "' is not a non-negative number of GB (e.g. 24 or 7.5)");
  return std::optional<double>(gb);
}

Status CheckFlag(const char* flag, const std::optional<double>& gb) {
  if (gb && (!std::isfinite(*gb) || *gb < 0))
    return Status::Error(std::string(flag) + ": must be a non-negative number of GB");
  return OkStatus();
}

uint64_t ToBytes(double gb) {
  return static_cast<uint64_t>(std::llround(gb * kBytesPerGb));
}

}  // namespace

std::string FormatGb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / kBytesPerGb);
  return buf;
}

std::optional<uint64_t> DefaultPinBudget(const HostMemoryInfo& host, std::string* why) {
  if (host.is_wsl) {
    const uint64_t b =
        static_cast<uint64_t>(static_cast<double>(host.total_bytes) * kWslPinFractionOfRam);
    *why = "default: 40% of RAM under WSL";
    return b;
  }
  *why = "default: uncapped on Linux";
  return std::nullopt;
}

uint64_t RamMargin(const HostMemoryInfo& host) {
  return std::max<uint64_t>(
      kLockMarginMinBytes,
      static_cast<uint64_t>(static_cast<double>(host.total_bytes) * kLockMarginFractionOfRam));
}

uint64_t RamForBanks(const HostMemoryInfo& host) {
  const uint64_t margin = RamMargin(host);
  return host.available_bytes > margin ? host.available_bytes - margin : 0;
}

uint64_t DefaultLockBudget(const HostMemoryInfo& host, std::string* why) {
  const uint64_t margin = RamMargin(host);
  const uint64_t free_less_margin = RamForBanks(host);
  if (host.may_lock_without_limit()) {
    *why = "default: available RAM less a " + FormatGb(margin) + " margin";
    return free_less_margin;
  }
  const uint64_t rl = *host.memlock_limit_bytes;
  if (rl <= free_less_margin) {
    *why = "default: RLIMIT_MEMLOCK (ulimit -l)";
    return rl;
  }
  *why = "default: RLIMIT_MEMLOCK capped to available RAM less a " + FormatGb(margin) + " margin";
  return free_less_margin;
}

Expected<Budgets> ResolveBudgets(const BudgetFlags& flags, const HostMemoryInfo& host) {
  MT_RETURN_IF_ERROR(CheckFlag("--pin-budget-gb", flags.pin_budget_gb));
  MT_RETURN_IF_ERROR(CheckFlag("--lock-budget-gb", flags.lock_budget_gb));
  MT_ASSIGN_OR_RETURN(std::optional<double> env_pin, EnvGb("MOETIER_PIN_BUDGET_GB"));
  MT_ASSIGN_OR_RETURN(std::optional<double> env_lock, EnvGb("MOETIER_LOCK_BUDGET_GB"));
  Budgets b;
  if (flags.pin_budget_gb) {
    b.pin_bytes = ToBytes(*flags.pin_budget_gb);
    b.pin_source = "--pin-budget-gb";
  } else if (env_pin) {
    b.pin_bytes = ToBytes(*env_pin);
    b.pin_source = "MOETIER_PIN_BUDGET_GB";
  } else {
    b.pin_bytes = DefaultPinBudget(host, &b.pin_source);
  }
  if (flags.lock_budget_gb) {
    b.lock_bytes = ToBytes(*flags.lock_budget_gb);
    b.lock_source = "--lock-budget-gb";
  } else if (env_lock) {
    b.lock_bytes = ToBytes(*env_lock);
    b.lock_source = "MOETIER_LOCK_BUDGET_GB";
  } else {
    b.lock_bytes = DefaultLockBudget(host, &b.lock_source);
  }
  return b;
}

}  // namespace moetier
