// The host-side switches of how our CUDA kernels are launched, for code that is not compiled by
// nvcc. Both are read once per process from the tuning knobs (core/tuning.h).
#pragma once

namespace moetier::cuda {

// Whether launch.cuh's Launch asks for programmatic dependent launch (MOETIER_CUDA_PDL, default
// on).
bool ProgrammaticLaunch();

// Whether decode steps use the fused launches (MOETIER_CUDA_FUSE, default off): the products of
// one x in one launch with x quantized inside it (dense.cu), top-k and grouping in one block
// (router.cu). Off: a launch per product and per stage. On the H200 the fused launches were
// 7-20 % slower for one q4_0 sequence in three of four same-call runs, and level for bf16
// (docs/benchmarks.md).
bool FusedLaunches();

}  // namespace moetier::cuda
