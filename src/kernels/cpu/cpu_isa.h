// Which instruction set the CPU kernels use, chosen once per process at run time.
//
// Each level's code is compiled in its own translation unit with that level's -m flags and is
// only ever called when cpuid (and the OS's XSAVE state, XCR0) says the CPU can run it, so one
// binary runs on any x86-64 CPU. MOETIER_CPU_ISA overrides the choice (tests, benchmarks).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moetier::kernels {

// Levels, each a superset of the instructions the previous x86 levels use, except that
// kAvxVnni (AVX2 + VEX VNNI, e.g. Alder Lake) is not needed by the AVX-512 levels.
enum class CpuIsa : uint8_t {
  kScalar,      // portable C++: the reference every other level is tested against
  kAvx2,        // AVX2 + FMA + F16C: fp32 FMA; int8 dots via vpmaddubsw
  kAvxVnni,     // kAvx2 + AVX-VNNI: int8 dots via VEX vpdpbusd on 256-bit registers
  kAvx512,      // AVX-512 F/BW/VL/DQ (+ FMA, F16C): fp32 FMA on 512 bits; vpmaddubsw
  kAvx512Vnni,  // kAvx512 + AVX512_VNNI: int8 dots via vpdpbusd
  // kAvx512Vnni + AVX512_BF16: bf16 weights use vdpbf16ps with activations rounded to bf16.
  // Lossy (see README.md), so it is never chosen automatically: only MOETIER_CPU_ISA selects it.
  kAvx512Bf16,
  // kAvx512Vnni + AMX-TILE/INT8/BF16 (Sapphire Rapids and later), with the OS granting this
  // process the tile state: Q8_0 and BF16 weights with PackMinTokens or more tokens go through
  // tile products (exact int8 block dots; bf16 with activations split exactly in three parts).
  kAmx,
};

// Every level, lowest first.
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2,       CpuIsa::kAvxVnni,
                                         CpuIsa::kAvx512, CpuIsa::kAvx512Vnni, CpuIsa::kAvx512Bf16,
                                         CpuIsa::kAmx};

// "scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "avx512bf16", "amx".
std::string_view CpuIsaName(CpuIsa isa);

// True when this CPU and OS can run `isa`'s code and this build contains it.
bool CpuSupports(CpuIsa isa);

// True on an x86 CPU whose cpuid vendor is "AuthenticAMD" (for tuning choices that were
// measured to differ between vendors; never for correctness).
bool CpuIsAmd();

// The best level chosen without an override: the highest supported of kAmx, kAvx512Vnni,
// kAvx512, kAvxVnni, kAvx2, kScalar (never kAvx512Bf16, which changes numerics).
CpuIsa BestCpuIsa();

// Name of the environment variable that overrides the choice.
inline constexpr const char* kCpuIsaEnv = "MOETIER_CPU_ISA";

// Resolves an override value: null, "" or "auto" give BestCpuIsa(); a level's name gives that
// level if CpuSupports it. An unknown name or an unsupported level is an error that says which
// values this CPU accepts.
Expected<CpuIsa> ResolveCpuIsa(const char* value);

// ResolveCpuIsa(getenv(MOETIER_CPU_ISA)), as a Status for front ends that want a bad override to
// be a hard error at startup (the kernels themselves fall back, see ActiveCpuIsa).
Status CheckCpuIsaEnvironment();

// The level MatMul and friends use: resolved from MOETIER_CPU_ISA on first call and fixed for
// the life of the process. A bad override never makes the process run an instruction the CPU
// lacks: it logs one warning on stderr and falls back to BestCpuIsa().
CpuIsa ActiveCpuIsa();

}  // namespace moetier::kernels
