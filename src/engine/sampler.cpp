#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace moetier {

int32_t ArgMax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (options_.temperature <= 0.0f) return ArgMax(logits);
  const double inv_t = 1.0 / options_.temperature;
  const float m = *std::max_element(logits.begin(), logits.end());
  probs_.resize(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    probs_[i] = std::exp((static_cast<double>(logits[i]) - m) * inv_t);
    sum += probs_[i];
  }
  // Draw u in [0, sum) from 53 random bits: the mapping from seed to token is fixed by this code,
  // not by a library's distribution implementation.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (size_t i = 0; i < probs_.size(); ++i) {
    acc += probs_[i];
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(probs_.size() - 1);
}

}  // namespace moetier
