// Bit-identity of the batched forward: a sequence's logits are the same bits whether it runs
// alone in one call or in steps that mix it with other sequences — whatever the steps' sizes,
// the order of tokens in them, where its KV blocks lie and the thread count. At a fixed kernel
// level: AMX tiles sum a batch differently from one row, so on CPUs with AMX the identity holds
// with MOETIER_CPU_ISA pinned below `amx` (docs/architecture.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/cpu/cpu_isa.h"
#include "model/causal_lm.h"
#include "support/test_support.h"

namespace moetier {
namespace {

class BatchIdentity : public ::testing::TestWithParam<const char*> {};

TEST_P(BatchIdentity, LogitsDoNotDependOnTheBatch) {
  if (kernels::ActiveCpuIsa() == kernels::CpuIsa::kAmx)
    GTEST_SKIP() << "AMX tiles sum batches differently; run with MOETIER_CPU_ISA=avx512bf16";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto alone_model = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(1));
  ASSERT_TRUE(alone_model.ok()) << alone_model.message();
  const int64_t V = (*alone_model)->config().vocab_size;
  const std::vector<int64_t> lengths = {23, 9, 31};
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<float>> want;  // [L, V] alone, all positions in one call
  for (int64_t L : lengths) {
    std::vector<int32_t> t(static_cast<size_t>(L));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
    KvCache cache = *(*alone_model)->NewCache(L);
    std::vector<float> logits;
    ASSERT_TRUE((*alone_model)->Forward(t, cache, LogitsFor::kAllTokens, logits).ok());
    seqs.push_back(t);
    want.push_back(logits);
  }

  for (int threads : {2, 3}) {
    auto model = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(threads));
    ASSERT_TRUE(model.ok());
    const int64_t B = 4;
    auto pool = KvPool::Create((*model)->kv_shape(), 32, B);
    ASSERT_TRUE(pool.ok());
    // Each sequence's blocks scattered through the pool.
    std::vector<int32_t> ids(32);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<std::vector<int32_t>> tables(seqs.size());
    for (size_t s = 0, next = 0; s < seqs.size(); ++s)
      for (int64_t b = 0; b * B < lengths[s]; ++b) tables[s].push_back(ids[next++]);
    const std::vector<std::span<const int32_t>> table_spans(tables.begin(), tables.end());

    std::vector<int64_t> done(seqs.size(), 0);
    std::vector<float> logits;
    while (done != lengths) {
      // A step: a random chunk of each of a random subset of the sequences, tokens shuffled.
      std::vector<std::pair<int32_t, int32_t>> items;  // (sequence, position)
      for (size_t s = 0; s < seqs.size(); ++s) {
        if (done[s] == lengths[s] || rng() % 3 == 0) continue;
        const int64_t n = std::min<int64_t>(lengths[s] - done[s], 1 + rng() % 8);
        for (int64_t p = done[s]; p < done[s] + n; ++p)
          items.emplace_back(static_cast<int32_t>(s), static_cast<int32_t>(p));
        done[s] += n;
      }
      if (items.empty()) continue;
      std::shuffle(items.begin(), items.end(), rng);
      std::vector<int32_t> tokens, positions, seq_of, rows;
      for (const auto& [s, p] : items) {
        tokens.push_back(seqs[static_cast<size_t>(s)][static_cast<size_t>(p)]);
        positions.push_back(p);
        seq_of.push_back(s);
        rows.push_back(static_cast<int32_t>(rows.size()));
      }
      Batch batch{tokens, positions, seq_of, table_spans, rows};
      ASSERT_TRUE((*model)->Forward(batch, *pool, logits).ok());
      for (size_t r = 0; r < items.size(); ++r) {
        const auto [s, p] = items[r];
        const float* ref = want[static_cast<size_t>(s)].data() + static_cast<int64_t>(p) * V;
        ASSERT_EQ(0, std::memcmp(ref, logits.data() + r * V, V * sizeof(float)))
            << "sequence " << s << " position " << p << " threads " << threads;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchIdentity,
                         ::testing::Values("qwen3_moe", "mixtral", "realvocab/qwen3_moe_tiny",
                                           "realvocab/mixtral_tiny"),
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

}  // namespace
}  // namespace moetier
