// The grouped-query attention kernel on every instruction set this CPU has, against a direct
// double-precision computation, on fresh random inputs; and its results independent of how the
// query heads are grouped into calls.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace moetier::kernels {
namespace {

constexpr double kU = 0x1p-24;  // float32 unit roundoff

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : kAllCpuIsas)
    if (CpuSupports(isa)) v.push_back(isa);
  return v;
}

struct Case {
  int64_t n_q, n_keys, d, kv_heads;
};

TEST(AttendSharedKv, MatchesDoublePrecisionOnEveryIsa) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));  // a failure replays with this seed
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Head sizes with and without a vector tail; key counts below, at and past the 4-key tile;
  // odd head counts (the 2-head tile's remainder); interleaved heads (kv_heads > 1: strided rows).
  const Case cases[] = {{1, 1, 128, 1}, {8, 37, 128, 4},  {3, 5, 64, 2}, {2, 4, 72, 1},
                        {5, 9, 13, 3},  {4, 130, 256, 2}, {7, 2, 8, 1},  {1, 63, 40, 8}};
  for (CpuIsa isa : SupportedIsas()) {
    for (const Case& c : cases) {
      const int64_t kv_stride = c.kv_heads * c.d;
      std::vector<float> q(static_cast<size_t>(c.n_q * c.d)), kv(2 * c.n_keys * kv_stride);
      for (float& v : q) v = dist(rng);
      for (float& v : kv) v = dist(rng);
      const float* keys = kv.data() + (c.kv_heads - 1) * c.d;  // the last head of each row
      const float* values = keys + c.n_keys * kv_stride;
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      std::vector<float> scores(static_cast<size_t>(c.n_q * c.n_keys));
      std::vector<float> out(static_cast<size_t>(c.n_q * c.d), NAN);
      AttendSharedKv(q.data(), c.n_q, c.d, keys, values, kv_stride, c.n_keys, c.d, scale,
                     scores.data(), out.data(), c.d, isa);
      for (int64_t g = 0; g < c.n_q; ++g) {
        // Reference in double, and the bound: each float score is off by at most
        // (d + 2) u scale sum|q k| (an fma chain, a lane sum, the scale); softmax turns score
        // errors into relative p errors of at most 2 max|δs| (+ its own float rounding), and the
        // value sum adds an fma chain over n_keys.
        std::vector<double> s(static_cast<size_t>(c.n_keys)), ds(s.size());
        for (int64_t j = 0; j < c.n_keys; ++j) {
          double dot = 0, mag = 0;
          for (int64_t i = 0; i < c.d; ++i) {
            const double t = static_cast<double>(q[g * c.d + i]) * keys[j * kv_stride + i];
            dot += t, mag += std::abs(t);
          }
          s[j] = dot * scale;
          ds[j] = (c.d + 2) * kU * mag * scale;
        }
        // p_j's relative error: the score errors, float exp(s_j - m) (whose argument rounds by
        // u |s_j - m|), the float sum and the scaling.
        const double m = *std::max_element(s.begin(), s.end());
        const double ds_max = *std::max_element(ds.begin(), ds.end());
        std::vector<double> p_rel(s.size());
        double z = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          p_rel[j] = 2 * ds_max + (std::abs(s[j] - m) + c.n_keys + 8) * kU;
          z += (s[j] = std::exp(s[j] - m));
        }
        for (int64_t i = 0; i < c.d; ++i) {
          double ref = 0, tol = 1e-30;
          for (int64_t j = 0; j < c.n_keys; ++j) {
            const double t = s[j] / z * values[j * kv_stride + i];
            ref += t;
            tol += (p_rel[j] + (c.n_keys + 2) * kU) * std::abs(t) * 1.01;
          }
          ASSERT_NEAR(out[g * c.d + i], ref, tol)
              << CpuIsaName(isa) << " n_q " << c.n_q << " n_keys " << c.n_keys << " d " << c.d
              << " head " << g << " element " << i;
        }
      }
    }
  }
}

TEST(AttendSharedKv, ResultsDoNotDependOnHowHeadsAreGrouped) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n_q = 7, n_keys = 23, d = 136;
  std::vector<float> q(n_q * d), kv(2 * n_keys * d);
  for (float& v : q) v = dist(rng);
  for (float& v : kv) v = dist(rng);
  const float* values = kv.data() + n_keys * d;
  std::vector<float> scores(n_q * n_keys), all(n_q * d), one(n_q * d);
  for (CpuIsa isa : SupportedIsas()) {
    AttendSharedKv(q.data(), n_q, d, kv.data(), values, d, n_keys, d, 0.1f, scores.data(),
                   all.data(), d, isa);
    for (int64_t g = 0; g < n_q;) {  // groups of 1, 2, 3, 1: every tile remainder
      const int64_t n = std::min<int64_t>(n_q - g, 1 + g % 3);
      AttendSharedKv(q.data() + g * d, n, d, kv.data(), values, d, n_keys, d, 0.1f, scores.data(),
                     one.data() + g * d, d, isa);
      g += n;
    }
    EXPECT_EQ(0, std::memcmp(all.data(), one.data(), all.size() * sizeof(float)))
        << CpuIsaName(isa);
  }
}

// Keys and values in runs scattered through memory (a paged cache's blocks) give what the same
// rows give contiguously: bit for bit on the SIMD levels (the value sum's fma chain continues
// through `out`, a float either way), within float rounding on the double-sum scalar reference.
TEST(AttendSharedKvRuns, ScatteredRunsEqualTheContiguousRows) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n_q = 5, d = 72, kv_heads = 2, kv_stride = kv_heads * d;
  for (int64_t n_keys : {1, 3, 16, 17, 61}) {
    std::vector<float> q(n_q * d), keys(n_keys * kv_stride), values(n_keys * kv_stride);
    for (float& v : q) v = dist(rng);
    for (float& v : keys) v = dist(rng);
    for (float& v : values) v = dist(rng);
    // Runs of random lengths, each copied to its own buffer with a gap before it.
    std::vector<std::vector<float>> storage;
    std::vector<KvRun> runs;
    for (int64_t j = 0; j < n_keys;) {
      const int64_t n = std::min<int64_t>(n_keys - j, 1 + rng() % 7);
      std::vector<float> buf(static_cast<size_t>((2 * n + 3) * kv_stride), NAN);
      std::copy_n(keys.begin() + j * kv_stride, n * kv_stride, buf.begin() + kv_stride);
      std::copy_n(values.begin() + j * kv_stride, n * kv_stride, buf.begin() + (n + 2) * kv_stride);
      storage.push_back(std::move(buf));
      runs.push_back({storage.back().data() + kv_stride + d,
                      storage.back().data() + (n + 2) * kv_stride + d, n});
      j += n;
    }
    std::vector<float> scores(n_q * n_keys), whole(n_q * d), paged(n_q * d);
    for (CpuIsa isa : SupportedIsas()) {
      AttendSharedKv(q.data(), n_q, d, keys.data() + d, values.data() + d, kv_stride, n_keys, d,
                     0.12f, scores.data(), whole.data(), d, isa);
      AttendSharedKvRuns(q.data(), n_q, d, runs, kv_stride, d, 0.12f, scores.data(), paged.data(),
                         d, isa);
      if (isa == CpuIsa::kScalar) {
        for (size_t i = 0; i < whole.size(); ++i)
          ASSERT_NEAR(paged[i], whole[i], 1e-5f * (1.0f + std::fabs(whole[i])))
              << "n_keys " << n_keys << " element " << i;
      } else {
        EXPECT_EQ(0, std::memcmp(whole.data(), paged.data(), whole.size() * sizeof(float)))
            << CpuIsaName(isa) << " n_keys " << n_keys << " runs " << runs.size();
      }
    }
  }
}

}  // namespace
}  // namespace moetier::kernels
