// The amx level's kernels: AVX-512 VNNI plus AMX tiles for Q8_0 and BF16 weights, compiled with
// its -m flags (CMakeLists.txt), called only when CpuSupports(CpuIsa::kAmx) says so (which also
// means the kernel granted this process the tile data state). Nothing but the impl headers may
// be included (matmul_isa.h).
#define MOETIER_KERNEL_AMX 1
#include "kernels/cpu/matmul_avx512_impl.h"
// After the AVX-512 kernels, which it falls back to.
#include "kernels/cpu/matmul_amx_impl.h"

namespace moetier::kernels::isa {
const Kernels* AmxKernels() {
  return &kKernels;
}
}  // namespace moetier::kernels::isa
