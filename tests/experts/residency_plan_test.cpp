// The residency planner: --moe-cpu-layers forms, the backend rules, the pin and lock budgets,
// and the one rule that picks which layers move.
#include <gtest/gtest.h>

#include "experts/residency_plan.h"

namespace moetier {
namespace {

std::vector<LayerBank> Banks(int n, uint64_t bytes = 100) {
  std::vector<LayerBank> b;
  for (int i = 0; i < n; ++i) b.push_back({i, bytes});
  return b;
}

std::vector<Tier> Tiers(const ResidencyPlan& p) {
  std::vector<Tier> t;
  for (const auto& l : p.layers) t.push_back(l.tier);
  return t;
}

constexpr Tier P = Tier::kPinned, L = Tier::kLocked, G = Tier::kPageable;

ResidencyPlan Plan(Backend backend, const std::string& spec, std::optional<uint64_t> pin,
                   std::optional<uint64_t> lock, std::vector<LayerBank> banks = Banks(6)) {
  PlanInputs in;
  in.backend = backend;
  in.banks = std::move(banks);
  in.budgets.pin_bytes = pin;
  in.budgets.lock_bytes = lock;
  auto s = ParseCpuLayersSpec(spec);
  EXPECT_TRUE(s.ok()) << s.message();
  in.cpu_layers = *s;
  auto p = PlanResidency(in);
  EXPECT_TRUE(p.ok()) << p.message();
  return *p;
}

TEST(CpuLayersSpec, EveryForm) {
  auto a = ParseCpuLayersSpec("auto");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, CpuLayersSpec::Kind::kAuto);
  auto none = ParseCpuLayersSpec("0");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->kind, CpuLayersSpec::Kind::kCount);
  EXPECT_EQ(none->count, 0);
  auto count = ParseCpuLayersSpec("12");
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(count->count, 12);
  auto frac = ParseCpuLayersSpec("0.25");
  ASSERT_TRUE(frac.ok());
  EXPECT_EQ(frac->kind, CpuLayersSpec::Kind::kFraction);
  EXPECT_DOUBLE_EQ(frac->fraction, 0.25);
  auto ids = ParseCpuLayersSpec("7, 0,5,2-3,5");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->ids, (std::vector<int64_t>{0, 2, 3, 5, 7}));
  auto one = ParseCpuLayersSpec("5,");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->ids, (std::vector<int64_t>{5}));
  auto range = ParseCpuLayersSpec("0-3");  // a range alone, as --help shows it
  ASSERT_TRUE(range.ok()) << range.message();
  EXPECT_EQ(range->kind, CpuLayersSpec::Kind::kIds);
  EXPECT_EQ(range->ids, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(CpuLayersSpec, MalformedIsAnErrorNamingTheFlag) {
  for (const char* bad : {"", "x", "-1", "1.5", "-0.5", "3-1", "1,,2", ",1", "1,a", "0.5.1", "2-",
                          "0-999999999", "1-2-3"}) {
    auto s = ParseCpuLayersSpec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.message().rfind("--moe-cpu-layers '", 0), 0u) << s.message();
  }
}

TEST(Plan, CpuBackendLocksEverything) {
  EXPECT_EQ(Tiers(Plan(Backend::kCpu, "auto", 0, std::nullopt)), (std::vector<Tier>(6, L)));
}

TEST(Plan, AutoBackendIsCpuWithoutGpuAndHybridWithOne) {
  PlanInputs in;
  in.banks = Banks(2);
  in.gpu_available = false;
  EXPECT_EQ(PlanResidency(in)->backend, Backend::kCpu);
  in.gpu_available = true;
  EXPECT_EQ(PlanResidency(in)->backend, Backend::kHybrid);
}

TEST(Plan, OffloadPinsAllButTheCpuLayers) {
  EXPECT_EQ(Tiers(Plan(Backend::kOffload, "0", std::nullopt, std::nullopt)),
            (std::vector<Tier>(6, P)));
  EXPECT_EQ(Tiers(Plan(Backend::kHybrid, "1,4", std::nullopt, std::nullopt)),
            (std::vector<Tier>{P, L, P, P, L, P}));
  // A count takes layers by the rule: equal sizes, so the lowest ids (as llama.cpp --n-cpu-moe).
  EXPECT_EQ(Tiers(Plan(Backend::kOffload, "2", std::nullopt, std::nullopt)),
            (std::vector<Tier>{L, L, P, P, P, P}));
  EXPECT_EQ(Tiers(Plan(Backend::kOffload, "0.5", std::nullopt, std::nullopt)),
            (std::vector<Tier>{L, L, L, P, P, P}));
}

TEST(Plan, AutoChoosesTheFewestCpuLayersThatFitThePinBudget) {
  // 600 bytes of banks, 350 pinnable: 3 layers must move.
  auto p = Plan(Backend::kOffload, "auto", 350, std::nullopt);
  EXPECT_EQ(Tiers(p), (std::vector<Tier>{L, L, L, P, P, P}));
  EXPECT_LE(p.BytesIn(Tier::kPinned), 350u);
  EXPECT_TRUE(p.warnings.empty());
  // Unequal banks: the biggest move first, so fewer layers move.
  std::vector<LayerBank> banks = {{0, 100}, {1, 300}, {2, 100}, {3, 100}};
  auto q = Plan(Backend::kOffload, "auto", 350, std::nullopt, banks);
  EXPECT_EQ(Tiers(q), (std::vector<Tier>{P, L, P, P}));
}

TEST(Plan, ExplicitLayersBeyondThePinBudgetMoveTooWithAWarning) {
  auto p = Plan(Backend::kOffload, "5,", 250, std::nullopt);
  EXPECT_LE(p.BytesIn(Tier::kPinned), 250u);
  EXPECT_EQ(p.layers[5].tier, L);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("--moe-cpu-layers 5,"), std::string::npos) << p.warnings[0];
}

TEST(Plan, OverTheLockBudgetTheRestIsPageableWithAWarningOfTheCost) {
  auto p = Plan(Backend::kCpu, "auto", std::nullopt, 250);
  EXPECT_EQ(Tiers(p), (std::vector<Tier>{G, G, G, G, L, L}));
  EXPECT_LE(p.BytesIn(Tier::kLocked), 250u);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("pageable"), std::string::npos);
  EXPECT_NE(p.warnings[0].find("disk read"), std::string::npos);
}

TEST(Plan, OutOfRangeSpecsAreErrorsNamingTheFlag) {
  PlanInputs in;
  in.backend = Backend::kOffload;
  in.banks = {{1, 10}, {3, 10}};  // layers 0 and 2 are dense
  in.cpu_layers = *ParseCpuLayersSpec("2,");
  auto p = PlanResidency(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.message().find("layer 2 is not a MoE layer"), std::string::npos) << p.message();
  EXPECT_NE(p.message().find("1,3"), std::string::npos) << p.message();
  in.cpu_layers = *ParseCpuLayersSpec("3");
  p = PlanResidency(in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.message().find("only 2 MoE layers"), std::string::npos) << p.message();
  // The same mistakes are errors under every backend, not only where the spec is used.
  for (Backend b : {Backend::kCpu, Backend::kAuto, Backend::kHybrid}) {
    in.backend = b;
    in.cpu_layers = *ParseCpuLayersSpec("0-9");
    EXPECT_FALSE(PlanResidency(in).ok()) << BackendName(b);
    in.cpu_layers = *ParseCpuLayersSpec("5");
    EXPECT_FALSE(PlanResidency(in).ok()) << BackendName(b);
  }
}

// Banks stored as bf16 of 100 bytes each, held packed in 80 for the CPU.
std::vector<LayerBank> PackedBanks(int n) {
  std::vector<LayerBank> b;
  for (int i = 0; i < n; ++i) b.push_back({i, 100, DType::kBF16, 80, DType::kBF16C});
  return b;
}

TEST(Plan, CpuLayersRecordThePackedBytesAndDType) {
  auto p = Plan(Backend::kCpu, "auto", std::nullopt, std::nullopt, PackedBanks(4));
  ASSERT_EQ(p.layers.size(), 4u);
  for (const auto& l : p.layers) {
    EXPECT_EQ(l.tier, L);
    EXPECT_EQ(l.bytes, 80u) << l.layer;
    EXPECT_EQ(l.dtype, DType::kBF16C) << l.layer;
  }
  EXPECT_EQ(p.BytesIn(Tier::kLocked), 320u);
  // Unpacked banks (cpu_bytes 0) are held as stored.
  auto q = Plan(Backend::kCpu, "auto", std::nullopt, std::nullopt,
                {{0, 100, DType::kQ8_0}, {1, 100, DType::kQ8_0}});
  for (const auto& l : q.layers) {
    EXPECT_EQ(l.bytes, 100u);
    EXPECT_EQ(l.dtype, DType::kQ8_0);
  }
}

TEST(Plan, TheLockBudgetCountsPackedBytes) {
  // 6 banks: 600 bytes stored, 480 packed. A 500-byte budget holds every packed bank.
  auto p = Plan(Backend::kCpu, "auto", std::nullopt, 500, PackedBanks(6));
  EXPECT_EQ(Tiers(p), (std::vector<Tier>(6, L)));
  EXPECT_EQ(p.BytesIn(Tier::kLocked), 480u);
  EXPECT_TRUE(p.warnings.empty());
  // The same budget and banks held as stored: one layer has to go.
  auto q = Plan(Backend::kCpu, "auto", std::nullopt, 500);
  EXPECT_EQ(Tiers(q), (std::vector<Tier>{G, L, L, L, L, L}));
  // A budget short of the packed bytes moves the fewest packed banks: 480 - 80 <= 400.
  auto r = Plan(Backend::kCpu, "auto", std::nullopt, 400, PackedBanks(6));
  EXPECT_EQ(Tiers(r), (std::vector<Tier>{G, L, L, L, L, L}));
  EXPECT_EQ(r.BytesIn(Tier::kLocked), 400u);
  EXPECT_EQ(r.layers[0].bytes, 80u);  // pageable banks are the CPU's too: still packed
  EXPECT_EQ(r.layers[0].dtype, DType::kBF16C);
  ASSERT_EQ(r.warnings.size(), 1u);
}

TEST(Plan, PinnedLayersKeepTheStoredFormatAndCpuLayersArePacked) {
  // Offload with layers 1 and 4 on the CPU.
  auto p = Plan(Backend::kOffload, "1,4", std::nullopt, std::nullopt, PackedBanks(6));
  EXPECT_EQ(Tiers(p), (std::vector<Tier>{P, L, P, P, L, P}));
  for (const auto& l : p.layers) {
    const bool cpu = l.tier == L;
    EXPECT_EQ(l.bytes, cpu ? 80u : 100u) << l.layer;
    EXPECT_EQ(l.dtype, cpu ? DType::kBF16C : DType::kBF16) << l.layer;
  }
  EXPECT_EQ(p.BytesIn(Tier::kPinned), 400u);
  EXPECT_EQ(p.BytesIn(Tier::kLocked), 160u);
  // Auto backend with a GPU is hybrid: a 250-byte pin budget sends layers (their stored 100
  // bytes each count against it) to the CPU, packed.
  PlanInputs in;
  in.gpu_available = true;
  in.banks = PackedBanks(4);
  in.budgets.pin_bytes = 250;
  auto h = PlanResidency(in);
  ASSERT_TRUE(h.ok()) << h.message();
  EXPECT_EQ(h->backend, Backend::kHybrid);
  EXPECT_EQ(Tiers(*h), (std::vector<Tier>{L, L, P, P}));
  EXPECT_EQ(h->BytesIn(Tier::kPinned), 200u);
  EXPECT_EQ(h->BytesIn(Tier::kLocked), 160u);
  EXPECT_EQ(h->layers[0].dtype, DType::kBF16C);
  EXPECT_EQ(h->layers[3].dtype, DType::kBF16);
}

// Hybrid with RAM known: the plan's copies for the CPU executor's share.
ResidencyPlan HybridPlan(const std::string& spec, std::optional<uint64_t> lock, uint64_t ram,
                         std::vector<LayerBank> banks) {
  PlanInputs in;
  in.backend = Backend::kHybrid;
  in.gpu_available = true;
  in.banks = std::move(banks);
  in.budgets.lock_bytes = lock;
  in.cpu_layers = *ParseCpuLayersSpec(spec);
  in.ram_for_banks = ram;
  auto p = PlanResidency(in);
  EXPECT_TRUE(p.ok()) << p.message();
  return *p;
}

TEST(Plan, HybridPinnedLayersKeepAPackedCopyForTheCpu) {
  // Layer 1 on the CPU; the pinned layers 0, 2 and 3 keep a BF16C copy each, locked.
  ResidencyPlan p = HybridPlan("1,", std::nullopt, 10'000, PackedBanks(4));
  EXPECT_EQ(Tiers(p), (std::vector<Tier>{P, L, P, P}));
  for (const auto& l : p.layers) {
    EXPECT_EQ(l.has_cpu_copy(), l.tier == P) << l.layer;
    if (!l.has_cpu_copy()) continue;
    EXPECT_EQ(l.cpu_copy_bytes, 80u);
    EXPECT_EQ(l.cpu_copy_dtype, DType::kBF16C);
    EXPECT_EQ(l.cpu_copy_tier, L);
    EXPECT_EQ(l.bytes, 100u);  // the pinned bank itself stays as stored
    EXPECT_EQ(l.dtype, DType::kBF16);
  }
  EXPECT_EQ(p.CpuCopyBytes(), 240u);
  EXPECT_EQ(p.BytesIn(Tier::kLocked), 80u + 240u);
  EXPECT_EQ(p.BytesIn(Tier::kPinned), 300u);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(Plan, CpuCopiesStayWithinTheLockBudgetAndRam) {
  // Lock budget 250: the locked layer's 80, then two copies (240); the third does not fit.
  ResidencyPlan lock = HybridPlan("1,", 250, 10'000, PackedBanks(4));
  EXPECT_EQ(lock.CpuCopyBytes(), 160u);
  EXPECT_TRUE(lock.layers[0].has_cpu_copy());
  EXPECT_FALSE(lock.layers[3].has_cpu_copy());
  ASSERT_EQ(lock.warnings.size(), 1u);
  EXPECT_NE(lock.warnings[0].find("1 pinned layer(s) keep no BF16C copy"), std::string::npos)
      << lock.warnings[0];
  EXPECT_NE(lock.warnings[0].find("--lock-budget-gb"), std::string::npos);
  // RAM for 4 banks (380 held) and one copy: 460 <= 470 < 540.
  ResidencyPlan ram = HybridPlan("1,", std::nullopt, 470, PackedBanks(4));
  EXPECT_EQ(ram.CpuCopyBytes(), 80u);
  EXPECT_EQ(ram.warnings.size(), 1u);
  // RAM unknown: no copies, nothing to warn about.
  ResidencyPlan unknown = HybridPlan("1,", std::nullopt, 0, PackedBanks(4));
  EXPECT_EQ(unknown.CpuCopyBytes(), 0u);
  EXPECT_TRUE(unknown.warnings.empty());
}

TEST(Plan, CpuCopiesOnlyWithHybridAndAPackedCpuFormat) {
  // As stored for the CPU (--weight-packing none, or a format that does not pack): no copy.
  EXPECT_EQ(HybridPlan("0", std::nullopt, 10'000, Banks(4)).CpuCopyBytes(), 0u);
  // Offload computes no pinned layer's experts on the CPU.
  PlanInputs in;
  in.backend = Backend::kOffload;
  in.gpu_available = true;
  in.banks = PackedBanks(4);
  in.ram_for_banks = 10'000;
  auto p = PlanResidency(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->CpuCopyBytes(), 0u);
}

// pack_pinned: pinned layers held as BF16C (the GPU expands them), so they count their packed
// bytes against the pin budget and need no CPU copy; without a GPU, or where the CPU format is
// not BF16C, nothing changes.
TEST(Plan, PackedPinnedBanksCountTheirPackedBytesAndKeepNoCopy) {
  PlanInputs in;
  in.backend = Backend::kHybrid;
  in.gpu_available = true;
  in.banks = PackedBanks(4);
  in.ram_for_banks = 10'000;
  in.pack_pinned = true;
  in.budgets.pin_bytes = 320;  // all four packed (80 each); as stored only three (100 each)
  auto p = PlanResidency(in);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(Tiers(*p), (std::vector<Tier>{P, P, P, P}));
  for (const auto& l : p->layers) {
    EXPECT_EQ(l.bytes, 80u) << l.layer;
    EXPECT_EQ(l.dtype, DType::kBF16C) << l.layer;
  }
  EXPECT_EQ(p->BytesIn(Tier::kPinned), 320u);
  EXPECT_EQ(p->CpuCopyBytes(), 0u);
  EXPECT_TRUE(p->warnings.empty());
  in.pack_pinned = false;
  auto stored = PlanResidency(in);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(Tiers(*stored), (std::vector<Tier>{L, P, P, P}));
  EXPECT_EQ(stored->layers[1].dtype, DType::kBF16);
  // No CPU format to pack into (--weight-packing none), or no GPU: as stored.
  in.pack_pinned = true;
  in.banks = Banks(4);
  auto none = PlanResidency(in);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->layers[1].dtype, DType::kBF16);
  EXPECT_EQ(none->layers[1].bytes, 100u);
  in.banks = PackedBanks(4);
  in.gpu_available = false;
  in.backend = Backend::kOffload;
  EXPECT_FALSE(PinsPacked(in, in.banks[0]));
}

TEST(Backend, Parse) {
  EXPECT_EQ(*ParseBackend("hybrid"), Backend::kHybrid);
  EXPECT_EQ(*ParseBackend("gpu"), Backend::kGpu);
  auto bad = ParseBackend("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--moe-backend 'fast'"), std::string::npos);
}

TEST(ResidencyPlan, GpuPutsEveryBankInVramAsStored) {
  PlanInputs in;
  in.backend = Backend::kGpu;
  in.gpu_available = true;
  in.banks = Banks(4);
  in.banks[0].dtype = in.banks[1].dtype = in.banks[2].dtype = in.banks[3].dtype = DType::kBF16;
  ResidencyPlan p = *PlanResidency(in);
  EXPECT_EQ(p.backend, Backend::kGpu);
  for (const LayerResidency& l : p.layers) {
    EXPECT_EQ(l.tier, Tier::kGpu);
    EXPECT_EQ(l.dtype, in.banks[0].dtype);  // never packed for the CPU
  }
}

TEST(ResidencyPlan, GpuWithoutADeviceRunsOnTheCpuAndSaysSo) {
  PlanInputs in;
  in.backend = Backend::kGpu;
  in.gpu_available = false;
  in.banks = Banks(4);
  ResidencyPlan p = *PlanResidency(in);
  EXPECT_EQ(p.backend, Backend::kCpu);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("no usable CUDA device"), std::string::npos);
}

}  // namespace
}  // namespace moetier
