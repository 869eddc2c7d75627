#include "experts/routing.h"

#include <algorithm>
#include <numeric>

namespace moetier {

void SelectTopK(const float* probs, int64_t n_tokens, const RouterOptions& opts, int32_t* ids,
                float* weights) {
  const int64_t E = opts.n_experts;
  const int64_t K = opts.top_k;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* p = probs + t * E;
    int32_t* id = ids + t * K;
    float* wt = weights + t * K;
    // Insertion into a sorted list of K: top_k is small (≤ 16 in real models).
    int64_t filled = 0;
    for (int32_t e = 0; e < E; ++e) {
      int64_t pos = filled;
      while (pos > 0 && p[e] > wt[pos - 1]) --pos;  // strict: ties keep the lower id first
      if (pos >= K) continue;
      const int64_t last = std::min(filled, K - 1);
      for (int64_t j = last; j > pos; --j) {
        wt[j] = wt[j - 1];
        id[j] = id[j - 1];
      }
      wt[pos] = p[e];
      id[pos] = e;
      if (filled < K) ++filled;
    }
    if (opts.normalize_top_k) {
      double sum = 0.0;
      for (int64_t j = 0; j < K; ++j) sum += wt[j];
      for (int64_t j = 0; j < K; ++j) wt[j] = static_cast<float>(wt[j] / sum);
    }
  }
}

void Routing::Group(const int32_t* ids, const float* weights, int64_t n_tokens_, int64_t top_k,
                    int64_t n_experts, std::vector<int32_t>& start) {
  const size_t n_assign = static_cast<size_t>(n_tokens_ * top_k);
  // start[e]: expert e's first assignment; advanced as assignments are placed.
  start.assign(static_cast<size_t>(n_experts + 1), 0);
  for (size_t i = 0; i < n_assign; ++i) ++start[static_cast<size_t>(ids[i]) + 1];
  std::partial_sum(start.begin(), start.end(), start.begin());
  n_tokens = n_tokens_;
  experts.clear();
  begin.clear();
  for (int32_t e = 0; e < n_experts; ++e) {
    if (start[static_cast<size_t>(e) + 1] == start[static_cast<size_t>(e)]) continue;
    experts.push_back(e);
    begin.push_back(start[static_cast<size_t>(e)]);
  }
  begin.push_back(static_cast<int32_t>(n_assign));
  token_of.resize(n_assign);
  weight_of.resize(n_assign);
  for (size_t i = 0; i < n_assign; ++i) {
    const int32_t pos = start[static_cast<size_t>(ids[i])]++;
    token_of[static_cast<size_t>(pos)] = static_cast<int32_t>(i / static_cast<size_t>(top_k));
    weight_of[static_cast<size_t>(pos)] = weights[i];
  }
}

}  // namespace moetier
