#include "model/causal_lm.h"

namespace moetier {

Status CausalLM::Forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                         std::vector<float>& logits) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T == 0) return Status::Error("no tokens to run");
  MT_RETURN_IF_ERROR(cache.Reserve(T));
  one_positions_.resize(tokens.size());
  one_seq_of_.assign(tokens.size(), 0);
  for (int64_t t = 0; t < T; ++t)
    one_positions_[static_cast<size_t>(t)] = static_cast<int32_t>(cache.n_past() + t);
  const int64_t first = which == LogitsFor::kLastToken ? T - 1 : 0;
  one_logit_rows_.resize(static_cast<size_t>(T - first));
  for (int64_t t = first; t < T; ++t)
    one_logit_rows_[static_cast<size_t>(t - first)] = static_cast<int32_t>(t);
  const std::span<const int32_t> table = cache.blocks();
  Batch batch;
  batch.tokens = tokens;
  batch.positions = one_positions_;
  batch.seq_of = one_seq_of_;
  batch.block_tables = std::span<const std::span<const int32_t>>(&table, 1);
  batch.logit_rows = one_logit_rows_;
  MT_RETURN_IF_ERROR(Forward(batch, cache.pool(), logits));
  cache.Advance(T);
  return OkStatus();
}

}  // namespace moetier
