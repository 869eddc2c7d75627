// Rotary position embedding, "neox" style (rotate_half): dimension i pairs with i + head_dim/2.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moetier {

class Rope {
 public:
  Rope() = default;
  Rope(int64_t head_dim, double theta);

  // Rotation in two parts, so the angles are computed once and heads rotated by many threads:
  // table[t * head_dim + i] = cos and table[t * head_dim + head_dim/2 + i] = sin of position
  // pos0 + t's angle i (i < head_dim/2); then n_heads heads of one token rotated with its row.
  void Angles(int64_t pos0, int64_t n_tokens, float* table) const;
  // The same for tokens at arbitrary positions: row t for positions[t].
  void Angles(std::span<const int32_t> positions, float* table) const;
  void Rotate(float* x, int64_t n_heads, const float* row) const;
  // The frequency of each dimension pair [head_dim / 2] (float32 values held as double).
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  void AnglesAt(int64_t pos, float* row) const;  // one row of the table
  int64_t head_dim_ = 0;
  std::vector<double> inv_freq_;  // [head_dim / 2]
};

}  // namespace moetier
