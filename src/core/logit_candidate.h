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

// A logit row's log-sum-exp, log Σ e^logit (the log-softmax's normalizer: a token's
// log-probability is its logit less this), and the logit of one token of it (Batch::scored), as
// a GPU hands them back beside the candidates, so that log-probabilities need no row.
struct RowLogSum {
  double log_sum_exp = 0.0;
  float token_logit = 0.0f;  // NaN: no token named
  int32_t token = -1;
};

// The largest k a step hands back candidates for (samplers with a larger top-k read the rows).
inline constexpr int32_t kMaxCandidateTopK = 64;
// Room for a row's candidates: more ties with the k-th largest than this, and the row itself
// is read instead.
inline constexpr int32_t kMaxLogitCandidates = 256;

// A row's draw made where its logits are (a GPU: kernels/cuda/draw.h defines it), for samplers
// of temperature, top-p and min-p over the whole vocabulary without penalties: the drawn token
// comes back as the row's one candidate. u, in [0, 1), picks the token; u < 0: no draw there,
// the row's top-k candidates instead.
struct RowDraw {
  double u = -1.0;
  float inv_temperature = 1.0f;
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;  // 0: off
};

// The largest vocabulary a device draw's integer weights sum over without overflow (draw.h).
inline constexpr int64_t kMaxDrawVocab = int64_t{1} << 20;

}  // namespace moetier
