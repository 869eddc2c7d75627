// Picks the next token from a row of logits: greedy at temperature 0, otherwise a seeded draw
// from softmax(logits / temperature). The same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace moetier {

struct SamplerOptions {
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}
  int32_t Sample(std::span<const float> logits);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<double> probs_;  // [vocab] scratch, reused
};

// Index of the largest logit (the lowest index among equals).
int32_t ArgMax(std::span<const float> logits);

}  // namespace moetier
