// The process-wide switches of launch.h.
#include "kernels/cuda/launch.h"

#include "core/tuning.h"

namespace moetier::cuda {

bool ProgrammaticLaunch() {
  static const bool on = Tuning().cuda_pdl.value_or(1) != 0;
  return on;
}

bool FusedLaunches() {
  static const bool on = Tuning().cuda_fuse.value_or(0) != 0;
  return on;
}

}  // namespace moetier::cuda
