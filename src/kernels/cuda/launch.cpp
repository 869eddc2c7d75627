// The process-wide switches of launch.h.
#include "kernels/cuda/launch.h"

#include <cuda_runtime_api.h>

#include <algorithm>

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

int64_t BlocksPerRow(int64_t by_length, int64_t n_rows, int64_t most) {
  int device = 0, sms = 1;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    sms = 1;
  }
  const int64_t by_sms = (4 * std::max(sms, 1) + n_rows - 1) / std::max<int64_t>(n_rows, 1);
  return std::clamp<int64_t>(std::min(by_length, by_sms), 1, most);
}

}  // namespace moetier::cuda
