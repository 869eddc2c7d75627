#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>
#include <cstring>

#include "core/log.h"

#if defined(MOETIER_X86_KERNELS)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace moetier::kernels {

namespace {

struct X86Features {
  bool avx2 = false;     // AVX2 + FMA + F16C, with the OS saving YMM state
  bool avxvnni = false;  // AVX-VNNI (VEX-encoded vpdpbusd)
  bool avx512 = false;   // AVX-512 F/BW/VL/DQ, with the OS saving ZMM and opmask state
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool amx = false;  // AMX-TILE/INT8/BF16, tile state saved by the OS and granted to us
};

#if defined(MOETIER_X86_KERNELS)
// XCR0 says which register state the OS saves on a context switch: a CPU may have AVX-512 while
// the OS (or hypervisor) leaves it off, and then those instructions fault.
uint64_t ReadXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Linux hands out the 8 KB tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM,
// kernel 5.16+); without it the first tile instruction faults. Other systems: no AMX.
bool RequestTileState() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

X86Features DetectX86() {
  X86Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
             f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  unsigned b7 = 0, c7 = 0, d7 = 0, a7 = 0;
  __cpuid_count(7, 0, a7, b7, c7, d7);
  unsigned a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  if (a7 >= 1) __cpuid_count(7, 1, a71, b71, c71, d71);
  const bool avx2 = b7 & (1u << 5);
  const bool avx512f = b7 & (1u << 16), avx512dq = b7 & (1u << 17), avx512bw = b7 & (1u << 30),
             avx512vl = b7 & (1u << 31);
  const bool avx512vnni = c7 & (1u << 11);
  const bool avxvnni = a71 & (1u << 4), avx512bf16 = a71 & (1u << 5);
  f.avx2 = os_ymm && avx2 && fma && f16c;
  f.avxvnni = f.avx2 && avxvnni;
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512vnni = f.avx512 && avx512vnni;
  f.avx512bf16 = f.avx512vnni && avx512bf16;
  const bool amx_bf16 = d7 & (1u << 22), amx_tile = d7 & (1u << 24), amx_int8 = d7 & (1u << 25);
  const bool os_tiles = (xcr0 & (3u << 17)) == (3u << 17);  // XTILECFG + XTILEDATA
  f.amx = f.avx512vnni && amx_tile && amx_int8 && amx_bf16 && os_tiles && RequestTileState();
  return f;
}
#endif

const X86Features& Features() {
#if defined(MOETIER_X86_KERNELS)
  static const X86Features f = DetectX86();
#else
  static const X86Features f;
#endif
  return f;
}

std::string SupportedList() {
  std::string s;
  for (CpuIsa isa : kAllCpuIsas) {
    if (!CpuSupports(isa)) continue;
    if (!s.empty()) s += "|";
    s += CpuIsaName(isa);
  }
  return s;
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvxVnni:
      return "avxvnni";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Vnni:
      return "avx512vnni";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "?";
}

bool CpuIsAmd() {
#if defined(MOETIER_X86_KERNELS)
  static const bool amd = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    return std::strcmp(vendor, "AuthenticAMD") == 0;
  }();
  return amd;
#else
  return false;
#endif
}

bool CpuSupports(CpuIsa isa) {
  const X86Features& f = Features();
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return f.avx2;
    case CpuIsa::kAvxVnni:
      return f.avxvnni;
    case CpuIsa::kAvx512:
      return f.avx512;
    case CpuIsa::kAvx512Vnni:
      return f.avx512vnni;
    case CpuIsa::kAvx512Bf16:
      return f.avx512bf16;
    case CpuIsa::kAmx:
      return f.amx;
  }
  return false;
}

CpuIsa BestCpuIsa() {
  for (CpuIsa isa :
       {CpuIsa::kAmx, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512, CpuIsa::kAvxVnni, CpuIsa::kAvx2})
    if (CpuSupports(isa)) return isa;
  return CpuIsa::kScalar;
}

Expected<CpuIsa> ResolveCpuIsa(const char* value) {
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "auto") == 0) return BestCpuIsa();
  for (CpuIsa isa : kAllCpuIsas) {
    if (CpuIsaName(isa) != value) continue;
    if (!CpuSupports(isa))
      return Status::Error(std::string(kCpuIsaEnv) + "=" + value +
                           ": this CPU (or this build) cannot run it; use one of auto|" +
                           SupportedList());
    return isa;
  }
  return Status::Error(std::string(kCpuIsaEnv) + "=" + value +
                       " is not a known instruction set; use one of auto|" + SupportedList());
}

Status CheckCpuIsaEnvironment() {
  return ResolveCpuIsa(std::getenv(kCpuIsaEnv)).status();
}

CpuIsa ActiveCpuIsa() {
  static const CpuIsa active = [] {
    Expected<CpuIsa> r = ResolveCpuIsa(std::getenv(kCpuIsaEnv));
    if (r.ok()) return *r;
    const CpuIsa best = BestCpuIsa();
    LogWarn(r.message() + "; using " + std::string(CpuIsaName(best)));
    return best;
  }();
  return active;
}

}  // namespace moetier::kernels
