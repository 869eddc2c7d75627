#include "layers/moe_block.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "layers/mlp.h"

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

void MoeBlock(Workspace& ws, const TensorView& router, const RouterOptions& opts,
              const ExpertSource& experts, int64_t layer, const float* x, int64_t n_tokens,
              int64_t d_model, float* out, float* router_logits_out) {
  const int64_t E = opts.n_experts;
  const int64_t K = opts.top_k;
  const size_t T = static_cast<size_t>(n_tokens);
  float* probs = ws.Get(Scratch::kRouter, T * static_cast<size_t>(E));
  kernels::MatMul(ws.pool(), x, n_tokens, router, probs);
  if (router_logits_out != nullptr)
    std::memcpy(router_logits_out, probs, T * static_cast<size_t>(E) * sizeof(float));
  for (int64_t t = 0; t < n_tokens; ++t) kernels::SoftmaxRow(probs + t * E, E);

  std::vector<int32_t>& ids = ws.ints(0);
  ids.resize(T * static_cast<size_t>(K));
  std::vector<float> weights_storage;  // tiny: [T, K]
  weights_storage.resize(T * static_cast<size_t>(K));
  SelectTopK(probs, n_tokens, opts, ids.data(), weights_storage.data());

  // Group tokens by expert so each expert's bytes are read once for all its tokens.
  std::vector<int32_t>& tokens_of = ws.ints(1);  // token index per (expert-sorted) assignment
  std::vector<int32_t>& slot_of = ws.ints(2);    // index into ids/weights
  std::vector<int32_t>& expert_start = ws.ints(3);
  expert_start.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t e : ids) ++expert_start[static_cast<size_t>(e) + 1];
  std::partial_sum(expert_start.begin(), expert_start.end(), expert_start.begin());
  tokens_of.resize(ids.size());
  slot_of.resize(ids.size());
  {
    std::vector<int32_t> fill(expert_start.begin(), expert_start.end() - 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t pos = fill[static_cast<size_t>(ids[i])]++;
      tokens_of[static_cast<size_t>(pos)] = static_cast<int32_t>(i / static_cast<size_t>(K));
      slot_of[static_cast<size_t>(pos)] = static_cast<int32_t>(i);
    }
  }

  std::memset(out, 0, T * static_cast<size_t>(d_model) * sizeof(float));
  for (int64_t e = 0; e < E; ++e) {
    const int32_t begin = expert_start[static_cast<size_t>(e)];
    const int32_t end = expert_start[static_cast<size_t>(e) + 1];
    if (begin == end) continue;
    const int64_t m = end - begin;
    float* gathered = ws.Get(Scratch::kGathered, static_cast<size_t>(m * d_model));
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(gathered + i * d_model, x + tokens_of[static_cast<size_t>(begin + i)] * d_model,
                  static_cast<size_t>(d_model) * sizeof(float));
    float* y = ws.Get(Scratch::kExpertOut, static_cast<size_t>(m * d_model));
    SwiGlu(ws, experts.Expert(layer, e), gathered, m, y);
    for (int64_t i = 0; i < m; ++i) {
      const size_t a = static_cast<size_t>(begin + i);
      kernels::Axpy(weights_storage[static_cast<size_t>(slot_of[a])], y + i * d_model, d_model,
                    out + tokens_of[a] * d_model);
    }
  }
}

}  // namespace moetier
