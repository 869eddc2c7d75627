// The avxvnni level's kernels: compiled with its -m flags (CMakeLists.txt), called only when
// CpuSupports(CpuIsa::kAvxVnni) says so. Nothing but the impl header may be included
// (matmul_isa.h).
#define MOETIER_KERNEL_AVXVNNI 1
#include "kernels/cpu/matmul_avx2_impl.h"

namespace moetier::kernels::isa {
const Kernels* AvxVnniKernels() {
  return &kKernels;
}
}  // namespace moetier::kernels::isa
