// Internal to kernels/cpu: which instruction set's kernel table a call runs.
#pragma once

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul_isa.h"

namespace moetier::kernels {

// The kernels to run for `cpu_isa`: the scalar ones if that ISA cannot run here, so that a
// caller's mistake can cost speed but never an illegal instruction.
const isa::Kernels& SafeKernels(CpuIsa cpu_isa);

}  // namespace moetier::kernels
