// One forward step's tokens, from any number of sequences: for every token its id, its position
// in its sequence and which sequence it belongs to; per sequence the KV blocks that hold its
// positions (backend/kv_cache.h); and which tokens need logits. The engine builds one per step;
// a single-sequence client builds one per call (CausalLM::Forward over a KvCache).
#pragma once

#include <cstdint>
#include <span>

#include "core/logit_candidate.h"

namespace moetier {

struct Batch {
  std::span<const int32_t> tokens;     // [n_tokens] token ids
  std::span<const int32_t> positions;  // [n_tokens] position of each token in its sequence
  std::span<const int32_t> seq_of;     // [n_tokens] index into block_tables
  // Per sequence, its blocks in position order; they must cover every position of its tokens.
  std::span<const std::span<const int32_t>> block_tables;
  // Ascending indices of the tokens whose logits are wanted; logits rows come in this order.
  std::span<const int32_t> logit_rows;
  // Empty, or one a logit row: the rows whose draw has u >= 0 are drawn where the logits are
  // (a GPU; ComputeBackend::TopKLogits), the others give their top-k candidates.
  std::span<const RowDraw> draws = {};
  // Empty, or one a logit row: a step ending in candidates (ComputeBackend::TopKLogits) also
  // hands back each row's RowLogSum, with the logit of token scored[r] (-1: none), so that
  // log-probabilities need no row: a prompt token's, or a drawn token's among the candidates.
  std::span<const int32_t> scored = {};

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

}  // namespace moetier
