// The avx2 level's kernels: compiled with its -m flags (CMakeLists.txt), called only when
// CpuSupports(CpuIsa::kAvx2) says so. Nothing but the impl header may be included (matmul_isa.h).
#include "kernels/cpu/matmul_avx2_impl.h"

namespace moetier::kernels::isa {
const Kernels* Avx2Kernels() {
  return &kKernels;
}
}  // namespace moetier::kernels::isa
