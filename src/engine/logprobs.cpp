#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/elementwise.h"

namespace moetier {

namespace {

// log(sum(exp(logits))), shifted by the row's largest value so no term overflows; the terms by
// the vectorized exponential (within 2e-7 relative), summed in double.
double LogSumExp(std::span<const float> logits) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, v);
  if (!std::isfinite(max)) return max;
  thread_local std::vector<float> terms;
  terms.resize(logits.size());
  const auto n = static_cast<int64_t>(logits.size());
  kernels::ScaledExp(logits.data(), n, max, 1.0, terms.data());
  return max + std::log(kernels::SumOf(terms.data(), n));
}

// The indices of the n largest values, largest first (ties: the lower index).
std::vector<int32_t> TopIndices(std::span<const float> logits, size_t n) {
  auto before = [&](int32_t a, int32_t b) {
    const float va = logits[static_cast<size_t>(a)], vb = logits[static_cast<size_t>(b)];
    return va > vb || (va == vb && a < b);
  };
  std::vector<int32_t> top;
  top.reserve(n + 1);
  for (size_t i = 0; i < logits.size() && n > 0; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (top.size() == n && !before(id, top.back())) continue;
    top.insert(std::upper_bound(top.begin(), top.end(), id, before), id);
    if (top.size() > n) top.pop_back();
  }
  return top;
}

}  // namespace

TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t token, int n_top) {
  const double log_z = LogSumExp(logits);
  auto logprob = [&](int32_t id) {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) return kNever;
    if (logits[static_cast<size_t>(id)] == kNever) return kNever;  // even in a row of nothing else
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - log_z);
  };
  TokenLogprobs out;
  out.chosen = {token, logprob(token)};
  for (int32_t id : TopIndices(logits, static_cast<size_t>(std::max(n_top, 0))))
    out.top.push_back({id, logprob(id)});
  return out;
}

}  // namespace moetier
