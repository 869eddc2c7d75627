// Host banks and settling: alignment, locking counted in VmLck, each degrade path (by injected
// failure and, without a GPU, for real), and on a GPU machine a pinned bank read back through
// its device pointer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "experts/host_bank.h"
#include "experts/host_memory.h"
#include "experts/memory_limits.h"
#include "experts/settle.h"
#include "support/seed.h"

namespace moetier {
namespace {

TEST(HostBank, AlignedAndMoveOnly) {
  auto b = HostBank::Allocate(10000);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % kBankAlignment, 0u);
  EXPECT_EQ(b->size(), 10000u);
  EXPECT_EQ(b->allocated_size(), 12288u);
  uint8_t* p = b->data();
  HostBank moved = std::move(*b);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(b->data(), nullptr);
}

TEST(HostBank, LockIsCountedInVmLckAndUndoneOnDestruction) {
  const uint64_t before = ReadVmLckBytes();
  {
    auto b = HostBank::Allocate(1 << 20);
    ASSERT_TRUE(b.ok());
    std::memset(b->data(), 1, b->size());
    Status s = b->Lock();
    if (!s.ok())
      GTEST_SKIP() << "mlock refused here (" << s.message() << "); degrade covered below";
    EXPECT_EQ(b->tier(), Tier::kLocked);
    EXPECT_GE(ReadVmLckBytes(), before + (1u << 20));
    EXPECT_FALSE(b->Lock().ok());  // settles once
  }
  EXPECT_EQ(ReadVmLckBytes(), before);
}

TEST(Settle, PinWithoutGpuDegradesToLockedWithAWarning) {
  auto b = HostBank::Allocate(8192);
  ASSERT_TRUE(b.ok());
  SettleResult r = SettleBank(*b, 3, Tier::kPinned, /*gpu_available=*/false, FailureInjection{});
  EXPECT_NE(r.tier, Tier::kPinned);
  EXPECT_NE(r.warning.find("layer 3: not pinned (no GPU)"), std::string::npos) << r.warning;
  EXPECT_EQ(b->device_ptr(), nullptr);
}

TEST(Settle, InjectedFailuresTakeEachDegradePath) {
  setenv("MOETIER_INJECT_FAILURES", "pin=all;lock=2,5", 1);
  const auto parsed = FailureInjectionFromEnv();
  unsetenv("MOETIER_INJECT_FAILURES");
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  const FailureInjection& inject = *parsed;
  EXPECT_TRUE(inject.FailPin(0));
  EXPECT_TRUE(inject.FailLock(5));
  EXPECT_FALSE(inject.FailLock(4));

  auto a = HostBank::Allocate(4096);
  SettleResult pinned_to_locked = SettleBank(*a, 1, Tier::kPinned, /*gpu_available=*/true, inject);
  EXPECT_NE(pinned_to_locked.warning.find("injected pin failure"), std::string::npos);
  EXPECT_NE(pinned_to_locked.tier, Tier::kPinned);

  auto b = HostBank::Allocate(4096);
  SettleResult to_pageable = SettleBank(*b, 2, Tier::kPinned, true, inject);
  EXPECT_EQ(to_pageable.tier, Tier::kPageable);
  EXPECT_EQ(b->tier(), Tier::kPageable);
  EXPECT_NE(to_pageable.warning.find("injected lock failure"), std::string::npos);

  auto c = HostBank::Allocate(4096);
  SettleResult locked_to_pageable = SettleBank(*c, 5, Tier::kLocked, true, inject);
  EXPECT_EQ(locked_to_pageable.tier, Tier::kPageable);
  EXPECT_NE(locked_to_pageable.warning.find("not locked"), std::string::npos);

  auto d = HostBank::Allocate(4096);
  EXPECT_EQ(SettleBank(*d, 0, Tier::kPageable, true, inject).tier, Tier::kPageable);
}

// On a machine with an NVIDIA GPU (a build with -DMOETIER_CUDA=ON): pin a bank, read an expert's
// bytes back through its device pointer with a CUDA copy, compare.
TEST(GpuPinnedBank, ExpertReadThroughDevicePointerMatches) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU here (or a build without CUDA): skipped";
  const size_t expert_bytes = 3 << 20, n_experts = 4;
  auto b = HostBank::Allocate(expert_bytes * n_experts);
  ASSERT_TRUE(b.ok());
  std::mt19937 rng(testing::TestSeed());
  for (size_t i = 0; i < b->size(); ++i) b->data()[i] = static_cast<uint8_t>(rng());
  Status s = b->Pin();
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(b->tier(), Tier::kPinned);
  ASSERT_NE(b->device_ptr(), nullptr);
  std::vector<uint8_t> back(expert_bytes);
  const size_t e = 2;
  s = CopyDeviceToHost(static_cast<const uint8_t*>(b->device_ptr()) + e * expert_bytes, back.data(),
                       expert_bytes);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(std::memcmp(back.data(), b->data() + e * expert_bytes, expert_bytes), 0);
}

}  // namespace
}  // namespace moetier

namespace moetier {
namespace {

TEST(Settle, MalformedInjectionIsAnErrorNamingTheVariable) {
  for (const char* bad : {"pin=x", "pin=1,,2", "pinn=all", "lock", "pin=-1"}) {
    const auto r = ParseFailureInjection(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.message().find("MOETIER_INJECT_FAILURES"), std::string::npos) << r.message();
  }
  EXPECT_TRUE(ParseFailureInjection("pin=all;lock=2,5;").ok());
}

}  // namespace
}  // namespace moetier
