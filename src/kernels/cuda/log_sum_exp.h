// Each logit row's log-sum-exp and one token's logit on the device (core/logit_candidate.h's
// RowLogSum), so that a step whose log-probabilities are wanted hands back 16 bytes a row beside
// its candidates instead of the vocabulary's logits (engine/logprobs.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/logit_candidate.h"

namespace moetier::cuda {

// For each row r < n_rows of x [n_rows, n]: out[r].log_sum_exp = kernels::LogSumExp(row, n)
// (within 1e-6: expf's terms summed in double), and out[r].token_logit = row[tokens[r]] with
// out[r].token = tokens[r] where tokens (device memory; null: none) names one in [0, n), else NaN
// and -1.
void LaunchLogSumExpRows(const float* x, int64_t n_rows, int64_t n, const int32_t* tokens,
                         RowLogSum* out, cudaStream_t stream);

}  // namespace moetier::cuda
