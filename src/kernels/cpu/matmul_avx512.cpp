// The avx512 level's kernels: compiled with its -m flags (CMakeLists.txt), called only when
// CpuSupports(CpuIsa::kAvx512) says so. Nothing but the impl header may be included (matmul_isa.h).
#include "kernels/cpu/matmul_avx512_impl.h"

namespace moetier::kernels::isa {
const Kernels* Avx512Kernels() {
  return &kKernels;
}
}  // namespace moetier::kernels::isa
