// The host-side switches and sizes of how our CUDA kernels are launched, each read once per
// process from the tuning knobs (core/tuning.h) in launch.cpp, which nvcc does not compile.
#pragma once

#include <cstdint>

namespace moetier::cuda {

// Whether launch.cuh's Launch asks for programmatic dependent launch (MOETIER_CUDA_PDL, default
// on).
bool ProgrammaticLaunch();

// Whether decode steps use the fused launches (MOETIER_CUDA_FUSE, default off): the Q8_0/Q4_0
// products of one x in one launch with x quantized inside it (dense.cu), top-k and grouping in
// one block (router.cu). Off: x quantized once, then a launch per product, and a launch per
// stage. On the H200 the fused launches were 7-20 % slower for one q4_0 sequence (docs/
// benchmarks.md). The float formats' products of one x are one launch either way.
bool FusedLaunches();

// Whether the norms between sublayers also scan the residual sums for NaN/inf and write their
// output quantized for the Q8_0/Q4_0 products that read it (MOETIER_CUDA_NORM_FUSE 1 or 2;
// CudaBackend): off (0), the scan and each product's quantizing are launches of their own.
bool FusedNorms();
// Whether the experts' decode kernels read the norm's quantized rows too (MOETIER_CUDA_NORM_FUSE
// 2, the default) instead of quantizing x themselves: one launch less a layer, but the GEMV
// gate+up then waits for the routing before it can prefetch its rows (launch.cuh).
bool NormsFeedExperts();

// Whether the decode kernels ask L2 for their weights before they wait for the kernel before
// them (MOETIER_CUDA_PREFETCH, default on): with PDL the fetch overlaps that kernel. The dense
// products' weights, and the expert GEMV kernels' rows, found from a routing written two or more
// launches back (launch.cuh).
bool PrefetchWeights();

// The fewest positions a split of the decode attention takes (MOETIER_CUDA_ATTN_CHUNK, default
// 64; attention.cu's PlanDecode).
int64_t AttentionMinChunk();

// The most assignments (tokens x top-k) of a decode step whose experts run on the one-warp-a-row
// kernels (MOETIER_CUDA_GEMV_ASSIGN, default 8: one token at top-8; expert_ffn.cu).
int64_t GemvMaxAssignments();

// Blocks a row for the kernels that cut rows of logits into slices, a block each (draw.cu,
// top_k.cu): four blocks an SM of the current device over the rows, but at most `by_length`
// (the row's slices of a useful length) and `most`, and at least 1. On an H100 (132 SMs;
// draw_bench, 151,936 logits, graph replays, us for 1 / 16 rows at 32, 64, 128, 256 blocks a row)
// top-p draws took 97 / 120, 70 / 146, 60 / 203, 48 / 282 and temperature draws 17 / 23, 15 / 24,
// 15 / 29, 12 / 39: the most blocks for one row, ~32 for 16.
int64_t BlocksPerRow(int64_t by_length, int64_t n_rows, int64_t most);

}  // namespace moetier::cuda
