// Layer math against direct scalar implementations on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "layers/attention.h"
#include "layers/moe_block.h"
#include "layers/rope.h"

namespace moetier {
namespace {

TEST(SelectTopK, PicksLargestWithLowerIdOnTiesAndRenormalises) {
  const std::vector<float> probs = {0.1f, 0.3f, 0.3f, 0.05f, 0.25f};
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  SelectTopK(probs.data(), 1, RouterOptions{5, 3, false}, ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_FLOAT_EQ(w[0], 0.3f);
  EXPECT_FLOAT_EQ(w[2], 0.25f);
  SelectTopK(probs.data(), 1, RouterOptions{5, 3, true}, ids.data(), w.data());
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0f, 1e-6f);
  EXPECT_NEAR(w[2], 0.25f / 0.85f, 1e-6f);
}

TEST(SelectTopK, MatchesSortOnRandomInputs) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 1 + static_cast<int>(rng() % 64);
    const int K = 1 + static_cast<int>(rng() % E);
    std::vector<float> p(static_cast<size_t>(E));
    for (float& v : p) v = dist(rng);
    std::vector<int32_t> ids(static_cast<size_t>(K));
    std::vector<float> w(static_cast<size_t>(K));
    SelectTopK(p.data(), 1, RouterOptions{E, K, false}, ids.data(), w.data());
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    for (int k = 0; k < K; ++k)
      ASSERT_EQ(ids[static_cast<size_t>(k)], order[static_cast<size_t>(k)]);
  }
}

TEST(Rope, RotatesPairsHalfApart) {
  const int64_t hd = 8;
  Rope rope(hd, 10000.0);
  std::vector<float> x(hd);
  std::iota(x.begin(), x.end(), 1.0f);
  std::vector<float> y = x;
  const int64_t pos = 37;
  rope.Apply(y.data(), 1, 1, pos);
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double f = 1.0 / std::pow(10000.0, 2.0 * i / hd);
    const double c = std::cos(pos * f), s = std::sin(pos * f);
    EXPECT_NEAR(y[i], x[i] * c - x[i + hd / 2] * s, 1e-5);
    EXPECT_NEAR(y[i + hd / 2], x[i + hd / 2] * c + x[i] * s, 1e-5);
  }
}

// Attention against a direct double-precision implementation, with GQA and a sliding window.
TEST(Attention, MatchesNaiveReference) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  for (int64_t window : {0, 3}) {
    AttentionShape s;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 8;
    s.sliding_window = window;
    const int64_t pos0 = 5, T = 4, n_pos = pos0 + T;
    const int64_t kv_row = s.n_kv_heads * s.head_dim;
    std::vector<float> q(static_cast<size_t>(T * s.n_heads * s.head_dim));
    std::vector<float> k(static_cast<size_t>(n_pos * kv_row)), v(k.size());
    for (auto* vec : {&q, &k, &v})
      for (float& e : *vec) e = dist(rng);
    std::vector<float> out(q.size(), NAN);
    CausalAttention(pool, q.data(), T, pos0, k.data(), v.data(), s, pos0 + T, out.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < s.n_heads; ++h) {
        const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
        const int64_t pos = pos0 + t;
        std::vector<double> sc;
        std::vector<int64_t> js;
        for (int64_t j = 0; j <= pos; ++j) {
          if (window > 0 && pos - j >= window) continue;
          double d = 0;
          for (int64_t i = 0; i < s.head_dim; ++i)
            d += static_cast<double>(q[static_cast<size_t>((t * s.n_heads + h) * s.head_dim + i)]) *
                 k[static_cast<size_t>(j * kv_row + kvh * s.head_dim + i)];
          sc.push_back(d / std::sqrt(static_cast<double>(s.head_dim)));
          js.push_back(j);
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double z = 0;
        for (double& e : sc) z += (e = std::exp(e - m));
        for (int64_t i = 0; i < s.head_dim; ++i) {
          double ref = 0;
          for (size_t n = 0; n < js.size(); ++n)
            ref += sc[n] / z * v[static_cast<size_t>(js[n] * kv_row + kvh * s.head_dim + i)];
          EXPECT_NEAR(out[static_cast<size_t>((t * s.n_heads + h) * s.head_dim + i)], ref, 1e-5)
              << "window " << window << " t " << t << " h " << h;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moetier
