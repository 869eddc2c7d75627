// Picks the next token from a row of logits, as Hugging Face's generate does with the same
// settings: repetition penalty, then temperature, top-k, top-p and min-p, then a seeded draw.
// The OpenAI API's logit bias comes first (as vLLM and llama.cpp order it), and its presence and
// frequency penalties after the repetition penalty, on the generated ids only (as vLLM orders
// them). Temperature 0 is greedy (the bias and penalties still apply).
// The same seed and inputs give the same tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/logit_candidate.h"
#include "core/status.h"

namespace moetier {

// The OpenAI API's logit_bias entry: `bias` added to token `id`'s logit.
struct TokenBias {
  int32_t id = 0;
  float bias = 0.0f;
};
// OpenAI's range for a bias: -100 bans a token in effect, 100 all but forces it.
inline constexpr float kMaxLogitBias = 100.0f;

struct SamplerOptions {
  float temperature = 0.0f;         // 0: greedy
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off; >1 discourages tokens already in the context
  uint64_t seed = 0;
  // OpenAI's definitions, in [-2, 2] (0: off), over the generated ids: a logit loses
  // presence_penalty when its token was generated at all, and frequency_penalty times the
  // number of times it was generated.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the logits before anything else, each in [-kMaxLogitBias, kMaxLogitBias], each id
  // once, within the vocabulary (the engine checks that: it knows the vocabulary's size).
  std::vector<TokenBias> logit_bias = {};
};

// Checks ranges; errors name the flag (--top-p etc.; logit_bias).
Status ValidateSamplerOptions(const SamplerOptions& o);
// A logit_bias token id as APIs write it, an object's key: decimal digits, at most INT32_MAX.
std::optional<int32_t> LogitBiasTokenId(std::string_view key);
// Whether every logit_bias id lies in [0, vocab); the error names the first that does not.
Status ValidateLogitBias(const SamplerOptions& o, int64_t vocab);

// A draw's working memory, vocabulary-sized: one per thread that samples (the engine keeps one
// per sampling thread, so sequences come and go without allocating it), reused across draws.
struct SamplerScratch {
  std::vector<float> work;                      // [vocab] penalised logits
  std::vector<int32_t> sorted;                  // generated ids, sorted (to count them)
  std::vector<std::pair<float, int32_t>> cand;  // candidates (penalised logit, id)
  std::vector<double> probs;                    // the candidates' weights
  std::vector<double> bucket_mass;              // weight by bucket of -ln(weight) (top-p)
  std::vector<float> weights;                   // [vocab] every token's weight, when all may win
  std::vector<double> chunk_mass;               // their sums by chunk (a plain draw)
  std::vector<float> largest;                   // top-k's heap of the k largest logits
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // `context`: the ids so far (prompt and generated), for the repetition penalty; its first
  // `n_prompt` are the prompt's, the rest were generated (presence and frequency penalties).
  // Logits that hold a NaN or an infinity are an error (a broken model), never a sample.
  // The draw works in `scratch`, or in the sampler's own.
  Expected<int32_t> Sample(std::span<const float> logits, std::span<const int32_t> context,
                           size_t n_prompt, SamplerScratch& scratch);
  Expected<int32_t> Sample(std::span<const float> logits, std::span<const int32_t> context = {},
                           size_t n_prompt = 0);
  // Whether every draw is the logits' first largest index whatever the context (greedy, no
  // penalty or bias): a caller may then ask the model for that index alone
  // (CausalLM::ForwardArgMax).
  bool DrawsArgMax() const;
  // How many of a row's largest logits (with their ties) a draw reads, when that is at most
  // kMaxCandidateTopK: top_k with no penalty or bias (1 when greedy); 0 when it may read the
  // whole row of a vocabulary of `vocab` tokens.
  int32_t CandidatesRead(int64_t vocab) const;
  // The token Sample would draw from the row, from the row's candidates (core/logit_candidate.h:
  // its logits of at least its k-th largest, k >= CandidatesRead(vocab) > 0, largest first),
  // the row having no non-finite logit (the caller checked); the same draw from the RNG.
  int32_t SampleCandidates(std::span<const LogitCandidate> cands, SamplerScratch& scratch);
  int32_t SampleCandidates(std::span<const LogitCandidate> cands) {
    return SampleCandidates(cands, own_);
  }
  // Whether a GPU may draw this sampler's tokens where the logits are (RowDraw,
  // kernels/cuda/draw.h): temperature, top-p and min-p over the whole vocabulary (no top-k
  // below it), no penalty or bias, a vocabulary of at most kMaxDrawVocab. An engine on a model
  // whose candidates come from the device may draw every such token there (EngineOptions::
  // device_draws): Sample's distribution, drawn by another walk, so a seed gives other tokens
  // than Sample.
  bool DrawsOnDevice(int64_t vocab) const;
  // The next device draw: the options, and the uniform that picks the token, which stays the
  // next one (a step run again draws with it again) until CommitDeviceDraw.
  RowDraw DeviceDraw();
  void CommitDeviceDraw() { pending_u_.reset(); }

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  SamplerScratch own_;               // empty until a draw without a scratch of its caller's
  std::optional<double> pending_u_;  // DeviceDraw's uniform, until committed
  // A uniform in [0, 1) from the next 53 random bits.
  double NextUniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  // Whether a repetition, presence or frequency penalty or a logit bias is on: a draw then reads
  // logits changed by the context or the request.
  bool ChangesLogits() const;
  // options_.logit_bias[id]'s bias (0 where it names none); bias_ holds them by id.
  float BiasOf(int32_t id) const;
  std::vector<TokenBias> bias_;  // options_.logit_bias, sorted by id
  // Penalises x.work (a copy of the logits) for the generated ids.
  void ApplyOccurrencePenalties(std::span<const int32_t> generated, SamplerScratch& x);
  // Fills x.cand with the tokens top-k, top-p and min-p may keep, the most likely first where
  // those filters need the order, and x.probs with their weights (the largest 1); returns the
  // weight top-p's share is of (every token's under top-k, else the whole vocabulary's).
  double Candidates(std::span<const float> logits, double inv_t, SamplerScratch& x);
  // x.probs = the weights of x.cand (a top-k's, in order; max the row's largest logit);
  // returns their sum, in that order.
  double WeighCandidates(float max, double inv_t, SamplerScratch& x) const;
  // Top-p and min-p over x.cand and x.probs (total: Candidates' return), then the draw.
  int32_t Draw(double total, SamplerScratch& x);
  // The k-th largest of l (k <= l.size()), counting equal values apart.
  static float KthLargest(std::span<const float> l, size_t k, SamplerScratch& x);
  // x.weights = every token's weight, e^((logit - max) / T), the largest 1.
  void TokenWeights(std::span<const float> logits, float max, double inv_t,
                    SamplerScratch& x) const;
  // A draw in which every token may win in proportion to its weight (temperature alone): no
  // order needed, the weights walked in token order.
  int32_t DrawInTokenOrder(std::span<const float> logits, double inv_t, SamplerScratch& x);
};

}  // namespace moetier
