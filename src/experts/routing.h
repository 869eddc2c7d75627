// Routing: which experts a step's tokens go to. The router's options and its top-k (math only),
// and a step's tokens grouped by expert for one MoE layer, in the form an expert executor runs:
// filled by a backend's Route, its vectors keep their capacity from step to step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moetier {

struct RouterOptions {
  int64_t n_experts = 0;
  int64_t top_k = 0;
  bool normalize_top_k = true;  // divide the chosen weights by their sum
};

// For each token, the top_k experts by routing probability (highest first; on equal
// probability the lower expert id first) and their weights. probs: [n_tokens, n_experts]
// softmax outputs; ids/weights: [n_tokens, top_k].
void SelectTopK(const float* probs, int64_t n_tokens, const RouterOptions& opts, int32_t* ids,
                float* weights);

struct Routing {
  int64_t n_tokens = 0;
  std::vector<int32_t> experts;   // the experts chosen by any token, ascending
  std::vector<int32_t> begin;     // [experts.size() + 1]: expert a's assignments
  std::vector<int32_t> token_of;  // [n_assignments] the token of each assignment, expert-major
  std::vector<float> weight_of;   // [n_assignments] its routing weight

  size_t n_active() const { return experts.size(); }
  size_t n_assignments() const { return token_of.size(); }
  int64_t first(size_t a) const { return begin[a]; }
  int64_t count(size_t a) const { return begin[a + 1] - begin[a]; }

  // Fills this routing from each token's top_k chosen experts ids [n_tokens, top_k] and their
  // weights: a counting sort by expert, tokens ascending within an expert. `start` is scratch.
  void Group(const int32_t* ids, const float* weights, int64_t n_tokens_, int64_t top_k,
             int64_t n_experts, std::vector<int32_t>& start);
};

}  // namespace moetier
