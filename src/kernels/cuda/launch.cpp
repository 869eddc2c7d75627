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

namespace {

// MOETIER_CUDA_NORM_FUSE: 0, 1 (the dense products read the norms' quantized rows) or 2 (the
// experts too).
int64_t NormFusion() {
  static const int64_t level = Tuning().cuda_norm_fuse.value_or(2);
  return level;
}

}  // namespace

bool FusedNorms() {
  return NormFusion() >= 1;
}

bool NormsFeedExperts() {
  return NormFusion() >= 2;
}

bool PrefetchWeights() {
  static const bool on = Tuning().cuda_prefetch.value_or(1) != 0;
  return on;
}

int64_t AttentionMinChunk() {
  static const int64_t chunk = Tuning().cuda_attn_chunk.value_or(64);
  return chunk;
}

int64_t GemvMaxAssignments() {
  static const int64_t n = Tuning().cuda_gemv_assign.value_or(8);
  return n;
}

}  // namespace moetier::cuda
