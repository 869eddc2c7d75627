// Log-probabilities of generated tokens, for an API's `logprobs`: the log-softmax of the model's
// logits row (the distribution the model gives, before temperature, penalties or truncation, as
// vLLM and the OpenAI API report them) at the token drawn, and the most likely tokens of the row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

}  // namespace moetier
