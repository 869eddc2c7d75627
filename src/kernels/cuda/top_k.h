// Each logit row's top-k candidates on the device (core/logit_candidate.h), so that a sampled
// decode step hands back a few hundred bytes a row instead of the vocabulary's logits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/logit_candidate.h"

namespace moetier::cuda {

// Device scratch LaunchTopKRows needs for n_rows rows (a histogram and a collection a row).
size_t TopKScratchBytes(int64_t n_rows);

// For each row r < n_rows of x [n_rows, n]: as kernels::TopKCandidates(row, n, k,
// kMaxLogitCandidates, out + r * kMaxLogitCandidates) with its count into counts[r] (k in
// [1, kMaxCandidateTopK]); -1 also when the row's values are bunched so tightly that over
// kTopKCollect of them lie in the k-th largest's histogram bin or above it (the caller then
// reads the row).
// As LaunchArgMaxRows, *first = min(*first, index in x of the first NaN or infinity) unless
// first is null. scratch: TopKScratchBytes(n_rows), cleared on the stream first.
void LaunchTopKRows(const float* x, int64_t n_rows, int64_t n, int32_t k, void* scratch,
                    LogitCandidate* out, int32_t* counts, unsigned long long* first,
                    cudaStream_t stream);

// Values a row's kernels gather before sorting: every value in the k-th largest's histogram bin
// or above it.
inline constexpr int32_t kTopKCollect = 2048;

}  // namespace moetier::cuda
