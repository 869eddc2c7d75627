// The process-wide switch of launch.cuh.
#include <atomic>

#include "kernels/cuda/launch.h"

namespace moetier::cuda {
namespace {

std::atomic<bool> programmatic_launch{true};

}  // namespace

void SetProgrammaticLaunch(bool on) {
  programmatic_launch.store(on, std::memory_order_relaxed);
}

bool ProgrammaticLaunch() {
  return programmatic_launch.load(std::memory_order_relaxed);
}

}  // namespace moetier::cuda
