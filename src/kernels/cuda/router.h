// The router's top-k and the grouping of a step's tokens by expert, on the device: what
// experts/routing.h's SelectTopK and Routing::Group do on the host. The router logits come from
// a DenseMatMul with the router matrix.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/routing.h"

namespace moetier::cuda {

// What LaunchTopK handles (a warp holds a token's probabilities in registers; real models have
// at most 256 experts and top-k 16); callers check a model against them at load.
inline constexpr int kMaxRouterExperts = 512;
inline constexpr int kMaxRouterTopK = 16;

// For each token t: probs = softmax(logits[t, :n_experts]); its top_k experts by probability
// (highest first; on equal probability the lower id first) into ids[t, :top_k] and their
// probabilities into weights[t, :top_k], divided by their sum when `normalize`.
void LaunchTopK(const float* logits, int64_t n_tokens, int64_t n_experts, int64_t top_k,
                bool normalize, int32_t* ids, float* weights, cudaStream_t stream);

// Fills r (n_tokens, top_k and n_experts set by the caller; arrays sized as routing.h says)
// from ids/weights [n_tokens, top_k]: the counting sort by expert of Routing::Group, plus
// assign_of.
void LaunchGroupByExpert(const int32_t* ids, const float* weights, const DeviceRouting& r,
                         cudaStream_t stream);

// LaunchTopK then LaunchGroupByExpert for r's step (r.n_tokens, top_k, n_experts), the same
// results; a step of a few tokens (decode) takes one launch instead of two.
void LaunchRoute(const float* logits, bool normalize, int32_t* ids, float* weights,
                 const DeviceRouting& r, cudaStream_t stream);

}  // namespace moetier::cuda
