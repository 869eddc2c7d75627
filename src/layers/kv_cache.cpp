#include "layers/kv_cache.h"

#include <algorithm>
#include <string>

namespace moetier {

KvCache::KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_positions)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      max_positions_(max_positions),
      k_(static_cast<size_t>(n_layers)),
      v_(static_cast<size_t>(n_layers)) {}

Status KvCache::Reserve(int64_t n_new) {
  const int64_t need = n_past_ + n_new;
  if (need > max_positions_)
    return Status::Error("the sequence needs " + std::to_string(need) +
                         " positions but the context holds " + std::to_string(max_positions_) +
                         "; raise --ctx-size or shorten the prompt");
  if (need <= capacity_) return OkStatus();
  // Doubling keeps growth amortised: a long generation copies each row O(1) times.
  const int64_t new_capacity = std::min(max_positions_, std::max<int64_t>(need, 2 * capacity_));
  const size_t n_floats = static_cast<size_t>(new_capacity * row_size());
  for (auto& k : k_) k.resize(n_floats);
  for (auto& v : v_) v.resize(n_floats);
  capacity_ = new_capacity;
  return OkStatus();
}

}  // namespace moetier
