// The pin and lock budgets: how many bytes of expert banks may be pinned for the GPU and
// mlock'ed for the CPU. Each comes from a flag, else an environment variable, else a default
// that depends on the host (one function each, below).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "experts/memory_limits.h"

namespace moetier {

struct BudgetFlags {
  std::optional<double> pin_budget_gb;   // --pin-budget-gb
  std::optional<double> lock_budget_gb;  // --lock-budget-gb
};

struct Budgets {
  std::optional<uint64_t> pin_bytes;   // nullopt: uncapped
  std::optional<uint64_t> lock_bytes;  // nullopt: uncapped
  std::string pin_source;              // "--pin-budget-gb", "MOETIER_PIN_BUDGET_GB", "default: ..."
  std::string lock_source;
};

// Under WSL the Windows driver refuses page-locked allocations past roughly half of RAM; 40%
// leaves room for the rest of the system's pinned memory.
inline constexpr double kWslPinFractionOfRam = 0.40;
// RAM kept free when the lock budget defaults to "what is available": the OS, the page cache
// for dense weights and the KV cache need room, and locking everything invites the OOM killer.
inline constexpr uint64_t kLockMarginMinBytes = 2ull << 30;
inline constexpr double kLockMarginFractionOfRam = 0.10;

// 1 GB = 1e9 bytes in every *-gb flag.
inline constexpr double kBytesPerGb = 1e9;

// "12.34 GB", for messages.
std::string FormatGb(uint64_t bytes);

// Default pin budget: uncapped on Linux, kWslPinFractionOfRam of RAM under WSL.
std::optional<uint64_t> DefaultPinBudget(const HostMemoryInfo& host, std::string* why);
// The RAM kept free beside the banks: kLockMarginMinBytes or kLockMarginFractionOfRam of RAM,
// whichever is more.
uint64_t RamMargin(const HostMemoryInfo& host);
// What the banks of every tier may take together: available RAM less RamMargin (0 if less).
uint64_t RamForBanks(const HostMemoryInfo& host);
// Default lock budget: RLIMIT_MEMLOCK unless the process may lock without limit, and never
// more than available RAM less the margin.
uint64_t DefaultLockBudget(const HostMemoryInfo& host, std::string* why);

// Resolves both budgets: flag, else environment (MOETIER_PIN_BUDGET_GB, MOETIER_LOCK_BUDGET_GB),
// else default. A malformed or negative value is an error naming the flag or variable.
Expected<Budgets> ResolveBudgets(const BudgetFlags& flags, const HostMemoryInfo& host);

}  // namespace moetier
