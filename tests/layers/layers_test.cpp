// Layer math against direct scalar implementations on fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/paged_attention.h"
#include "backend/rope.h"
#include "core/thread_pool.h"
#include "experts/routing.h"

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
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
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
  std::vector<float> angles(hd);
  rope.Angles(pos, 1, angles.data());
  rope.Rotate(y.data(), 1, angles.data());
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double f = 1.0 / std::pow(10000.0, 2.0 * i / hd);
    const double c = std::cos(pos * f), s = std::sin(pos * f);
    EXPECT_NEAR(y[i], x[i] * c - x[i + hd / 2] * s, 1e-5);
    EXPECT_NEAR(y[i + hd / 2], x[i + hd / 2] * c + x[i] * s, 1e-5);
  }
}

// Attention over a paged cache against a direct double-precision implementation: GQA, a
// sliding window, two sequences in one batch with their blocks scattered through the pool, and
// every KV dtype (the reference reads the rows as stored, so bf16/f16 rounding is not counted).
TEST(Attention, MatchesNaiveReferenceOverScatteredBlocks) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t window : {0, 3}) {
      AttentionShape s;
      s.n_heads = 4;
      s.n_kv_heads = 2;
      s.head_dim = 8;
      s.sliding_window = window;
      const int64_t kv_row = s.n_kv_heads * s.head_dim, B = 4;
      const KvShape shape{1, s.n_kv_heads, s.head_dim};
      auto made = KvPool::Create(shape, 8, B, dtype);
      ASSERT_TRUE(made.ok()) << made.message();
      KvPool kv = std::move(made).value();
      // Sequence 0: positions 0..9 in blocks 5, 1, 6; sequence 1: positions 0..6 in 2, 7.
      const std::vector<int32_t> table0 = {5, 1, 6}, table1 = {2, 7};
      const std::vector<std::span<const int32_t>> tables = {table0, table1};
      const int64_t n_pos[2] = {10, 7};
      std::vector<std::vector<float>> keys(2), values(2);  // [n_pos, kv_row] as stored
      for (int q = 0; q < 2; ++q) {
        keys[q].resize(static_cast<size_t>(n_pos[q] * kv_row));
        values[q].resize(keys[q].size());
        for (auto* vec : {&keys[q], &values[q]})
          for (float& e : *vec) e = dist(rng);
        for (int64_t p = 0; p < n_pos[q]; ++p)
          kv.WriteRows(tables[q][static_cast<size_t>(p / B)], 0, p % B, 1,
                       keys[q].data() + p * kv_row, values[q].data() + p * kv_row);
        for (auto* vec : {&keys[q], &values[q]})  // what the pool holds
          for (float& e : *vec)
            e = dtype == DType::kBF16  ? Bf16ToF32(F32ToBf16(e))
                : dtype == DType::kF16 ? F16ToF32(F32ToF16(e))
                                       : e;
      }
      // The last 4 positions of sequence 0 and the last 3 of sequence 1, interleaved.
      const std::vector<int32_t> positions = {6, 4, 7, 5, 8, 6, 9};
      const std::vector<int32_t> seq_of = {0, 1, 0, 1, 0, 1, 0};
      Batch batch;
      batch.positions = positions;
      batch.seq_of = seq_of;
      batch.block_tables = tables;
      batch.tokens = positions;  // ids are not read here
      const int64_t T = batch.n_tokens();
      std::vector<float> q(static_cast<size_t>(T * s.n_heads * s.head_dim));
      for (float& e : q) e = dist(rng);
      std::vector<float> out(q.size(), NAN);
      std::vector<float> q_in = q;
      CausalAttention(pool, q_in.data(), batch, kv, 0, s, out.data());
      for (int64_t t = 0; t < T; ++t) {
        const auto& k = keys[static_cast<size_t>(seq_of[static_cast<size_t>(t)])];
        const auto& v = values[static_cast<size_t>(seq_of[static_cast<size_t>(t)])];
        for (int64_t h = 0; h < s.n_heads; ++h) {
          const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
          const int64_t pos = positions[static_cast<size_t>(t)];
          std::vector<double> sc;
          std::vector<int64_t> js;
          for (int64_t j = 0; j <= pos; ++j) {
            if (window > 0 && pos - j >= window) continue;
            double d = 0;
            for (int64_t i = 0; i < s.head_dim; ++i)
              d += static_cast<double>(
                       q[static_cast<size_t>((t * s.n_heads + h) * s.head_dim + i)]) *
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
                << DTypeName(dtype) << " window " << window << " t " << t << " h " << h;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moetier
