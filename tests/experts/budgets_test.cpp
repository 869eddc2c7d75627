// Pin and lock budgets: defaults per host, overrides by flag and environment, and errors.
#include <gtest/gtest.h>

#include <cstdlib>

#include "experts/budgets.h"

namespace moetier {
namespace {

HostMemoryInfo Host(bool wsl, std::optional<uint64_t> rlimit, bool cap) {
  HostMemoryInfo h;
  h.total_bytes = 100'000'000'000;
  h.available_bytes = 80'000'000'000;
  h.is_wsl = wsl;
  h.memlock_limit_bytes = rlimit;
  h.has_cap_ipc_lock = cap;
  return h;
}

struct ScopedEnv {
  ScopedEnv(const char* k, const char* v) : key(k) { setenv(k, v, 1); }
  ~ScopedEnv() { unsetenv(key); }
  const char* key;
};

TEST(Budgets, PinDefaultsUncappedOnLinuxAndFortyPercentUnderWsl) {
  auto linux_b = ResolveBudgets({}, Host(false, 8 << 20, false));
  ASSERT_TRUE(linux_b.ok());
  EXPECT_FALSE(linux_b->pin_bytes.has_value());
  auto wsl = ResolveBudgets({}, Host(true, 8 << 20, false));
  ASSERT_TRUE(wsl.ok());
  EXPECT_EQ(*wsl->pin_bytes, 40'000'000'000u);
}

TEST(Budgets, LockDefaultsToRlimitUnlessUnlimitedAndNeverPastFreeRamLessMargin) {
  // 100 GB RAM: margin 10 GB, 80 GB available → at most 70 GB.
  EXPECT_EQ(*ResolveBudgets({}, Host(false, 8 << 20, false))->lock_bytes, 8u << 20);
  EXPECT_EQ(*ResolveBudgets({}, Host(false, std::nullopt, false))->lock_bytes, 70'000'000'000u);
  EXPECT_EQ(*ResolveBudgets({}, Host(false, 8 << 20, true))->lock_bytes, 70'000'000'000u);
  EXPECT_EQ(*ResolveBudgets({}, Host(false, 90'000'000'000, false))->lock_bytes, 70'000'000'000u);
}

TEST(Budgets, FlagBeatsEnvironmentBeatsDefault) {
  ScopedEnv pin("MOETIER_PIN_BUDGET_GB", "12.5");
  ScopedEnv lock("MOETIER_LOCK_BUDGET_GB", "3");
  auto env = ResolveBudgets({}, Host(false, std::nullopt, true));
  ASSERT_TRUE(env.ok()) << env.message();
  EXPECT_EQ(*env->pin_bytes, 12'500'000'000u);
  EXPECT_EQ(env->pin_source, "MOETIER_PIN_BUDGET_GB");
  EXPECT_EQ(*env->lock_bytes, 3'000'000'000u);
  BudgetFlags flags;
  flags.pin_budget_gb = 1;
  auto f = ResolveBudgets(flags, Host(false, std::nullopt, true));
  EXPECT_EQ(*f->pin_bytes, 1'000'000'000u);
  EXPECT_EQ(f->pin_source, "--pin-budget-gb");
}

TEST(Budgets, MalformedValuesNameTheirSource) {
  {
    ScopedEnv pin("MOETIER_PIN_BUDGET_GB", "lots");
    auto r = ResolveBudgets({}, Host(false, std::nullopt, true));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("MOETIER_PIN_BUDGET_GB: 'lots'"), std::string::npos) << r.message();
  }
  BudgetFlags flags;
  flags.lock_budget_gb = -2;
  auto r = ResolveBudgets(flags, Host(false, std::nullopt, true));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("--lock-budget-gb"), std::string::npos);
}

TEST(HostMemory, ReadsThisMachine) {
  const HostMemoryInfo h = ReadHostMemoryInfo();
  EXPECT_GT(h.total_bytes, 0u);
  EXPECT_LE(h.available_bytes, h.total_bytes);
}

}  // namespace
}  // namespace moetier
