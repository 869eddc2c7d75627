// Log-probabilities of generated tokens, for an API's `logprobs`: the log-softmax of the model's
// logits row (the distribution the model gives, before temperature, penalties or truncation, as
// vLLM and the OpenAI API report them) at the token drawn, and the most likely tokens of the row.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/logit_candidate.h"

namespace moetier {

// The most alternatives a request may ask for (OpenAI's top_logprobs limit).
constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  TokenLogprob chosen;            // the token generated
  std::vector<TokenLogprob> top;  // the n_top most likely, most likely first (ties: lower id)
};

// `token`'s log-probability in `logits` and the `n_top` most likely tokens' (at most the row's
// size). The log-sum-exp is taken in double precision over the whole row.
TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t token, int n_top);

// The same from what a GPU hands back instead of the row (of `row_size` logits): its candidates
// (core/logit_candidate.h, in TopIndices' order) and its RowLogSum. `token`'s logit is
// sum.token_logit where sum.token is it, else found among the candidates. Nullopt when it is
// not there, or when fewer than n_top candidates came while the row held more: read the row.
std::optional<TokenLogprobs> LogprobsOfCandidates(std::span<const LogitCandidate> cands,
                                                  const RowLogSum& sum, int32_t token, int n_top,
                                                  int64_t row_size);

}  // namespace moetier
