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
}

TEST(CpuLayersSpec, MalformedIsAnErrorNamingTheFlag) {
  for (const char* bad :
       {"", "x", "-1", "1.5", "-0.5", "3-1", "1,,2", ",1", "1,a", "0.5.1", "2-"}) {
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
}

TEST(Backend, Parse) {
  EXPECT_EQ(*ParseBackend("hybrid"), Backend::kHybrid);
  EXPECT_FALSE(ParseBackend("gpu").ok());
  auto bad = ParseBackend("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--moe-backend 'fast'"), std::string::npos);
}

}  // namespace
}  // namespace moetier
