#include "backend/rope.h"

#include <cmath>

namespace moetier {

Rope::Rope(int64_t head_dim, double theta) : head_dim_(head_dim) {
  const int64_t half = head_dim / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // Hugging Face computes the frequencies in float32; matching its rounding keeps the angles
    // equal at long positions, where an ulp of frequency becomes a visible phase error.
    const float f = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(static_cast<float>(2 * i) /
                                                  static_cast<float>(head_dim))));
    inv_freq_[static_cast<size_t>(i)] = f;
  }
}

void Rope::AnglesAt(int64_t pos, float* row) const {
  const int64_t half = head_dim_ / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inv_freq_[static_cast<size_t>(i)];
    row[i] = static_cast<float>(std::cos(angle));
    row[half + i] = static_cast<float>(std::sin(angle));
  }
}

void Rope::Angles(int64_t pos0, int64_t n_tokens, float* table) const {
  for (int64_t t = 0; t < n_tokens; ++t) AnglesAt(pos0 + t, table + t * head_dim_);
}

void Rope::Angles(std::span<const int32_t> positions, float* table) const {
  for (size_t t = 0; t < positions.size(); ++t)
    AnglesAt(positions[t], table + static_cast<int64_t>(t) * head_dim_);
}

void Rope::Rotate(float* x, int64_t n_heads, const float* row) const {
  const int64_t half = head_dim_ / 2;
  const float* cs = row;
  const float* sn = row + half;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim_;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace moetier
