// The avx512bf16 level's kernels: compiled with its -m flags (CMakeLists.txt), called only when
// CpuSupports(CpuIsa::kAvx512Bf16) says so. Nothing but the impl header may be included
// (matmul_isa.h).
#define MOETIER_KERNEL_AVX512BF16 1
#include "kernels/cpu/matmul_avx512_impl.h"

namespace moetier::kernels::isa {
const Kernels* Avx512Bf16Kernels() {
  return &kKernels;
}
}  // namespace moetier::kernels::isa
