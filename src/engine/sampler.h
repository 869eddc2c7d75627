// Picks the next token from a row of logits, as Hugging Face's generate does with the same
// settings: repetition penalty, then temperature, top-k, top-p and min-p, then a seeded draw.
// Temperature 0 is greedy (the repetition penalty still applies). The same seed and inputs give
// the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace moetier {

struct SamplerOptions {
  float temperature = 0.0f;         // 0: greedy
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off; >1 discourages tokens already in the context
  uint64_t seed = 0;
};

// Checks ranges; errors name the flag (--top-p etc.).
Status ValidateSamplerOptions(const SamplerOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  // `context`: the ids so far (prompt and generated), for the repetition penalty. Logits that
  // hold a NaN or an infinity are an error (a broken model), never a sample.
  Expected<int32_t> Sample(std::span<const float> logits, std::span<const int32_t> context = {});

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<float> work_;                      // [vocab] penalised logits, reused
  std::vector<std::pair<float, int32_t>> cand_;  // candidates (penalised logit, id), reused
  std::vector<double> probs_;
};

// Index of the largest logit (the lowest index among equals).
int32_t ArgMax(std::span<const float> logits);

}  // namespace moetier
