// Tokens drawn on the GPU from rows of logits (RowDraw, core/logit_candidate.h), so that a
// sampled step hands back one token a row instead of the row. Each row is cut into slices drawn
// by blocks of their own, over two launches, or six with top-p (draw.cu). The draw,
// exactly: its sums are of integers, so a row's token depends on that row alone and the same
// inputs always give the same token.
// - Weights w = e^((logit - max) * inv_temperature) in float (the largest exactly 1), held as
//   integers W = round(w * 2^44): a token under 2^-45 of the most likely one is never drawn.
// - Top-p (top_p < 1): the most likely first (logit descending, id ascending), the shortest
//   prefix whose W reach ceil(top_p * the row's sum of W).
// - Min-p (min_p > 0): of those, the tokens with w >= min_p.
// - The kept tokens in id order: the one where their running sum of W first exceeds
//   floor(u * their sum).
// Non-finite logits weigh nothing (the step's non-finite scan reports them). This is the
// sampler's distribution (engine/sampler.h), drawn by another walk than its host draw, so the
// same u may pick another token there.
#pragma once

#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/logit_candidate.h"

namespace moetier::cuda {

// What a step's draws ask of the GPU.
struct DrawWork {
  bool any = false;        // a row is drawn
  bool top_p = false;      // a drawn row has top-p: its sweeps run
  bool every_row = false;  // every row is drawn: nothing reads the rows' top-k candidates
  friend auto operator<=>(const DrawWork&, const DrawWork&) = default;
};
inline DrawWork DrawWorkOf(std::span<const RowDraw> draws) {
  DrawWork work;
  work.every_row = !draws.empty();
  for (const RowDraw& d : draws) {
    const bool drawn = d.u >= 0.0;
    work.any = work.any || drawn;
    work.top_p = work.top_p || (drawn && d.top_p < 1.0f);
    work.every_row = work.every_row && drawn;
  }
  return work;
}

// Device scratch LaunchDrawRows needs for n_rows rows.
size_t DrawScratchBytes(int64_t n_rows);

// For each row r < n_rows of x [n_rows, n] (n <= kMaxDrawVocab) whose draws[r].u >= 0: the
// drawn token into out[r * kMaxLogitCandidates] (its logit and id) and 1 into counts[r]; other
// rows are left as they are. As LaunchTopKRows over the drawn rows, *first = min(*first, index
// in x of the first NaN or infinity) unless first is null (a step whose every row is drawn needs
// no top-k). work: DrawWorkOf the draws. draws and scratch (DrawScratchBytes(n_rows)): device
// memory. slices: blocks a row (0: chosen for the GPU's SMs); a row's token does not depend on it.
void LaunchDrawRows(const float* x, int64_t n_rows, int64_t n, const RowDraw* draws, DrawWork work,
                    void* scratch, LogitCandidate* out, int32_t* counts, unsigned long long* first,
                    cudaStream_t stream, int slices = 0);

}  // namespace moetier::cuda
