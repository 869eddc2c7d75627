// The avx512vnni level's kernels: compiled with its -m flags (CMakeLists.txt), called only when
// CpuSupports(CpuIsa::kAvx512Vnni) says so. Nothing but the impl header may be included
// (matmul_isa.h).
#define MOETIER_KERNEL_AVX512VNNI 1
#include "kernels/cpu/matmul_avx512_impl.h"

namespace moetier::kernels::isa {
const Kernels* Avx512VnniKernels() {
  return &kKernels;
}
}  // namespace moetier::kernels::isa
