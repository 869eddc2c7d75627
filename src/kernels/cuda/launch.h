// The host-side switch of launch.cuh's programmatic dependent launch, for code that is not
// compiled by nvcc.
#pragma once

namespace moetier::cuda {

// Whether Launch asks for programmatic dependent launch (default on; MOETIER_CUDA_PDL=0 turns it
// off, through ComputeOptions). Process-wide: every backend in a process shares the setting.
void SetProgrammaticLaunch(bool on);
bool ProgrammaticLaunch();

}  // namespace moetier::cuda
