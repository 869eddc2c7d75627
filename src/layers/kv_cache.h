// The key/value cache of one sequence: per layer, K and V for every position so far, float32,
// [position, n_kv_heads, head_dim]. It grows by doubling up to `max_positions`, so a decode step
// at position 500 costs the same as at position 5 apart from attention over the cache.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace moetier {

class KvCache {
 public:
  KvCache() = default;
  KvCache(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, int64_t max_positions);

  int64_t n_past() const { return n_past_; }
  int64_t max_positions() const { return max_positions_; }
  int64_t row_size() const { return n_kv_heads_ * head_dim_; }  // floats per position
  int64_t capacity() const { return capacity_; }  // positions allocated (grows by doubling)

  // Makes room for n_past() + n_new positions; fails (naming the limit) past max_positions.
  Status Reserve(int64_t n_new);
  // Marks n_new positions (whose K/V the layers wrote) as part of the sequence.
  void Advance(int64_t n_new) { n_past_ += n_new; }
  // Forgets every position from `n` on (n <= n_past()).
  void Truncate(int64_t n) { n_past_ = n < n_past_ ? n : n_past_; }

  float* keys(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  float* values(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }
  const float* keys(int64_t layer) const { return k_[static_cast<size_t>(layer)].data(); }
  const float* values(int64_t layer) const { return v_[static_cast<size_t>(layer)].data(); }

 private:
  int64_t n_kv_heads_ = 0;
  int64_t head_dim_ = 0;
  int64_t max_positions_ = 0;
  int64_t capacity_ = 0;  // positions allocated per layer
  int64_t n_past_ = 0;
  std::vector<std::vector<float>> k_, v_;  // [layer][capacity, n_kv_heads, head_dim]
};

}  // namespace moetier
