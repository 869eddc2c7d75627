// Run-time instruction-set choice: names, the MOETIER_CPU_ISA override, and the rule for a bad
// override (ResolveCpuIsa reports an error; the kernels fall back to the best supported level).
// CMakeLists.txt also runs these tests with MOETIER_CPU_ISA set to scalar and to a bogus value.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"

namespace moetier::kernels {
namespace {

TEST(CpuIsa, NamesResolveExactlyWhenSupported) {
  for (CpuIsa isa : kAllCpuIsas) {
    const std::string name(CpuIsaName(isa));
    Expected<CpuIsa> r = ResolveCpuIsa(name.c_str());
    EXPECT_EQ(r.ok(), CpuSupports(isa)) << name;
    if (r.ok()) {
      EXPECT_EQ(*r, isa);
    } else {
      EXPECT_NE(r.message().find("cannot run"), std::string::npos) << r.message();
    }
  }
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
}

TEST(CpuIsa, AutoAndEmptyPickTheBest) {
  for (const char* v : {static_cast<const char*>(nullptr), "", "auto"}) {
    Expected<CpuIsa> r = ResolveCpuIsa(v);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, BestCpuIsa());
  }
  EXPECT_TRUE(CpuSupports(BestCpuIsa()));
  // The lossy bf16-activation path is opt-in only.
  EXPECT_NE(BestCpuIsa(), CpuIsa::kAvx512Bf16);
}

TEST(CpuIsa, UnknownNameIsAClearError) {
  for (const char* v : {"avx9000", "AVX2", "sse"}) {
    Expected<CpuIsa> r = ResolveCpuIsa(v);
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_NE(r.message().find("MOETIER_CPU_ISA"), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(v), std::string::npos) << r.message();
    EXPECT_NE(r.message().find("scalar"), std::string::npos) << r.message();  // lists choices
  }
}

TEST(CpuIsa, LevelsNest) {
  if (CpuSupports(CpuIsa::kAmx)) {
    EXPECT_TRUE(CpuSupports(CpuIsa::kAvx512Vnni));
    EXPECT_EQ(BestCpuIsa(), CpuIsa::kAmx);
  }
  if (CpuSupports(CpuIsa::kAvx512Bf16)) {
    EXPECT_TRUE(CpuSupports(CpuIsa::kAvx512Vnni));
  }
  if (CpuSupports(CpuIsa::kAvx512Vnni)) {
    EXPECT_TRUE(CpuSupports(CpuIsa::kAvx512));
  }
  if (CpuSupports(CpuIsa::kAvx512)) {
    EXPECT_TRUE(CpuSupports(CpuIsa::kAvx2));
  }
  if (CpuSupports(CpuIsa::kAvxVnni)) {
    EXPECT_TRUE(CpuSupports(CpuIsa::kAvx2));
  }
}

// The process-wide choice follows the environment: a valid supported value is used as is,
// anything else falls back to BestCpuIsa() (never an unsupported level).
TEST(CpuIsa, ActiveFollowsTheEnvironment) {
  const char* env = std::getenv(kCpuIsaEnv);
  Expected<CpuIsa> want = ResolveCpuIsa(env);
  EXPECT_EQ(ActiveCpuIsa(), want.ok() ? *want : BestCpuIsa()) << (env ? env : "(unset)");
  EXPECT_TRUE(CpuSupports(ActiveCpuIsa()));
  EXPECT_EQ(CheckCpuIsaEnvironment().ok(), want.ok());
}

TEST(CpuIsa, UnsupportedRequestNeverRunsUnsupportedCode) {
  // PreparedActivations::Prepare given an ISA the CPU lacks uses the scalar kernels.
  for (CpuIsa isa : kAllCpuIsas) {
    if (CpuSupports(isa)) continue;
    PreparedActivations p;
    const float x[32] = {1.0f};
    p.Prepare(x, 1, 32, DType::kQ8_0, isa);
    EXPECT_EQ(p.isa(), CpuIsa::kScalar) << CpuIsaName(isa);
  }
}

// The vendor behind tuning choices (FloatStreamPrefetchBytes) is the one the kernel reports.
TEST(CpuIsa, VendorMatchesProcCpuinfo) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, vendor;
  while (vendor.empty() && std::getline(cpuinfo, line))
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  EXPECT_EQ(CpuIsAmd(), vendor == "AuthenticAMD") << vendor;
  if (std::getenv("MOETIER_FLOAT_PREFETCH_BYTES") != nullptr) return;
  const int64_t amd =
      CpuSupports(CpuIsa::kAvx512) ? kFloatPrefetchBytesAmdAvx512 : kFloatPrefetchBytesAmd;
  EXPECT_EQ(FloatStreamPrefetchBytes(), CpuIsAmd() ? amd : kFloatPrefetchBytes);
}

}  // namespace
}  // namespace moetier::kernels
