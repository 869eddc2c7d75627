// The avx2 level's kernels: compiled with its -m flags (CMakeLists.txt), called only when
// CpuSupports(CpuIsa::kAvx2) says so. Nothing but the impl header may be included (matmul_isa.h).
#include "kernels/cpu/matmul_avx2_impl.h"

namespace moetier::kernels::isa {
const Kernels* Avx2Kernels() {
  return &kKernels;
}
void Avx2ExpandBf16cRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
                         uint16_t* out, int64_t ahead, uintptr_t stop) {
  ExpandBf16cRows(w, row_bytes, n_rows, k, out, ahead, stop);
}
void Avx2Bf16cRowsToF32(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                        int64_t stride, int64_t ahead, uintptr_t stop) {
  ConvertRows<WFormat::kBF16C>(w, row_bytes, n_rows, k, out, stride, ahead, stop);
}
}  // namespace moetier::kernels::isa
