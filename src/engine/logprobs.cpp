#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/elementwise.h"

namespace moetier {

namespace {

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

// A logit's log-probability in a row of log-sum-exp log_z: -inf stays -inf, even in a row of
// nothing else (where log_z is -inf too).
float LogprobOf(float logit, double log_z) {
  if (logit == -std::numeric_limits<float>::infinity()) return logit;
  return static_cast<float>(static_cast<double>(logit) - log_z);
}

}  // namespace

TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t token, int n_top) {
  const double log_z = kernels::LogSumExp(logits.data(), static_cast<int64_t>(logits.size()));
  auto logprob = [&](int32_t id) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size())
      return -std::numeric_limits<float>::infinity();
    return LogprobOf(logits[static_cast<size_t>(id)], log_z);
  };
  TokenLogprobs out;
  out.chosen = {token, logprob(token)};
  for (int32_t id : TopIndices(logits, static_cast<size_t>(std::max(n_top, 0))))
    out.top.push_back({id, logprob(id)});
  return out;
}

std::optional<TokenLogprobs> LogprobsOfCandidates(std::span<const LogitCandidate> cands,
                                                  const RowLogSum& sum, int32_t token, int n_top,
                                                  int64_t row_size) {
  const auto n = static_cast<size_t>(std::min<int64_t>(std::max(n_top, 0), row_size));
  if (cands.size() < n) return std::nullopt;
  std::optional<float> logit;
  if (sum.token == token && token >= 0) logit = sum.token_logit;
  for (const LogitCandidate& c : cands)
    if (!logit && c.id == token) logit = c.logit;
  if (!logit) return std::nullopt;
  TokenLogprobs out;
  out.chosen = {token, LogprobOf(*logit, sum.log_sum_exp)};
  for (size_t k = 0; k < n; ++k)
    out.top.push_back({cands[k].id, LogprobOf(cands[k].logit, sum.log_sum_exp)});
  return out;
}

}  // namespace moetier
