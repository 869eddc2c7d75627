// A logit row's candidates for a top-k draw, as a GPU hands them back instead of the row
// (ComputeBackend::TopKLogits): the row's finite logits of at least its k-th largest value
// (every tie with it), the largest first, equal logits by index ascending. That is all a
// sampler with top-k (and temperature, top-p, min-p, but no penalty) reads of a row.
#pragma once

#include <cstdint>

namespace moetier {

struct LogitCandidate {
  float logit = 0.0f;
  int32_t id = 0;
};

// The largest k a step hands back candidates for (samplers with a larger top-k read the rows).
inline constexpr int32_t kMaxCandidateTopK = 64;
// Room for a row's candidates: more ties with the k-th largest than this, and the row itself
// is read instead.
inline constexpr int32_t kMaxLogitCandidates = 256;

}  // namespace moetier
