// The engine: many requests at once give each the tokens it gets alone (greedy), whatever the
// others, their arrival, the step size, preemption or the prefix cache; and its limits end
// requests cleanly.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "engine/engine_fixture.h"
#include "engine/generate.h"
#include "kernels/cpu/cpu_isa.h"
#include "support/gpu.h"
#include "support/seed.h"
#include "support/test_support.h"

namespace moetier {
namespace {

using engine_testing::EachAlone;
using engine_testing::EngineBatching;
using engine_testing::Outcome;
using engine_testing::Requests;
using engine_testing::RunAll;

// Continuous batching with prompts cut into chunks, requests joining at different steps, and
// every ordering the scheduler makes: each request's greedy tokens equal its tokens alone.
TEST_P(EngineBatching, ManyRequestsGiveWhatEachGivesAlone) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto requests = Requests(7, seed, model_->config().vocab_size);
  const auto alone = Alone(requests);
  for (int64_t max_batch_tokens : {1, 5, 64}) {
    for (int parallel : {2, 7}) {
      for (size_t i = 0; i < requests.size(); ++i)
        requests[i].arrival_step = static_cast<int64_t>(i % 3) * 2;
      EngineOptions o;
      o.kv_positions = 2048;
      o.max_running = parallel;
      o.max_batch_tokens = max_batch_tokens;
      auto engine = Engine::Create(*model_, nullptr, o);
      ASSERT_TRUE(engine.ok()) << engine.message();
      const auto together = RunAll(**engine, requests);
      for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_TRUE(together[i].finished);
        EXPECT_TRUE(together[i].status.ok()) << together[i].status.message();
        EXPECT_EQ(together[i].tokens, alone[i].tokens)
            << "request " << i << " batch tokens " << max_batch_tokens << " parallel " << parallel;
        EXPECT_EQ(together[i].reason, StopReason::kMaxTokens);
      }
    }
  }
}

// Runs `requests` alone, each on a fresh engine, then together on one: each request's tokens
// are the same.
void ExpectTogetherAsAlone(CausalLM& model, const std::vector<RequestOptions>& requests) {
  const std::vector<Outcome> alone = EachAlone(model, requests);
  EngineOptions o;
  o.kv_positions = 2048;
  o.max_running = static_cast<int>(requests.size());
  auto engine = Engine::Create(model, nullptr, o);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const auto together = RunAll(**engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(together[i].status.ok()) << together[i].status.message();
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
  }
}

// Seeded sampling (each request its own seed and settings): drawn together on the engine's
// sampling threads, each request's tokens equal its tokens alone. Where AMX tiles run the
// batched products they sum a batch differently from one row (batch_identity_test.cpp), and a
// draw at temperature 1.5 follows the last bits of the logits: skipped there.
TEST_P(EngineBatching, SampledRequestsGiveWhatEachGivesAlone) {
  if (kernels::ActiveCpuIsa() == kernels::CpuIsa::kAmx)
    GTEST_SKIP() << "AMX tiles sum batches differently; run with MOETIER_CPU_ISA=avx512bf16";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto requests = Requests(7, seed, model_->config().vocab_size);
  std::mt19937 rng(seed);
  for (auto& r : requests) {
    r.sampler.temperature = 1.5f;
    r.sampler.top_p = (rng() % 2) != 0 ? 0.9f : 1.0f;
    r.sampler.seed = rng();
  }
  ExpectTogetherAsAlone(*model_, requests);
}

// The same requests on the GPU, submitted in one order and in the reverse: each request's
// tokens are the same, whether its rows are drawn on the device (temperature, top-p and min-p
// rows; top-k rows hand back candidates, a row with a penalty reads its row) or all on the host.
// The GPU's kernels sum a row differently at another batch size (greedy continuations agree
// only where margins allow: gpu_placement_test.cpp), and a draw follows the last bits of the
// logits, so this compares runs whose steps hold the same rows in another order: every prompt
// fits the first step, and nothing is taken from the prefix cache.
TEST_P(EngineBatching, SampledRequestsInAnyOrderOnTheGpu) {
  MT_REQUIRE_GPU();
  auto m = OnTheGpu();
  ASSERT_TRUE(m.ok()) << m.message();
  ASSERT_TRUE((*m)->CandidatesOnDevice());
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto requests = Requests(7, seed, (*m)->config().vocab_size);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplerOptions& s = requests[i].sampler;
    s.temperature = 1.2f;
    s.top_p = i % 3 == 1 ? 0.8f : 1.0f;
    s.min_p = i == 2 ? 0.02f : 0.0f;
    s.top_k = i == 3 ? 20 : 0;
    s.repetition_penalty = i == 5 ? 1.3f : 1.0f;
    s.seed = rng();
  }
  std::vector<RequestOptions> reversed(requests.rbegin(), requests.rend());
  for (bool device_draws : {true, false}) {
    SCOPED_TRACE(device_draws ? "drawn on the device" : "drawn on the host");
    EngineOptions o;
    o.device_draws = device_draws;
    o.kv_positions = 2048;
    o.max_running = static_cast<int>(requests.size());
    o.max_batch_tokens = 1024;
    o.prefix_cache = false;
    std::vector<Outcome> runs[2];
    for (int k = 0; k < 2; ++k) {
      auto engine = Engine::Create(**m, nullptr, o);
      ASSERT_TRUE(engine.ok()) << engine.message();
      runs[k] = RunAll(**engine, k == 0 ? requests : reversed);
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      const Outcome& first = runs[0][i];
      const Outcome& second = runs[1][requests.size() - 1 - i];
      EXPECT_TRUE(first.status.ok() && second.status.ok()) << "request " << i;
      EXPECT_EQ(first.tokens.size(), static_cast<size_t>(requests[i].max_new_tokens));
      EXPECT_EQ(first.tokens, second.tokens) << "request " << i;
    }
  }
}

// A pool too small for everyone at once: sequences are preempted and recomputed, and still
// give what they give alone; one request that alone exceeds the pool is refused, the others go on.
TEST_P(EngineBatching, PreemptionAndOversizedRequests) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Four sequences of 50 positions (4 blocks each) in 6 blocks: two are admitted (2 blocks of
  // prompt each), and their decoding outgrows the pool, so one is preempted, and so on.
  auto requests = Requests(4, seed, model_->config().vocab_size);
  for (auto& r : requests) {
    r.prompt.resize(20, 5);
    r.max_new_tokens = 30;
  }
  const auto alone = Alone(requests);
  RequestOptions huge;
  huge.prompt.assign(200, 1);
  huge.max_new_tokens = 2;
  requests.insert(requests.begin() + 2, huge);
  EngineOptions o;
  o.kv_positions = 6 * KvPool::kDefaultBlockSize;
  o.max_running = 5;
  o.max_batch_tokens = 32;
  auto engine = Engine::Create(*model_, nullptr, o);
  ASSERT_TRUE(engine.ok());
  const auto together = RunAll(**engine, requests);
  ASSERT_FALSE(together[2].status.ok());
  EXPECT_NE(together[2].status.message().find("200 tokens"), std::string::npos)
      << together[2].status.message();
  EXPECT_NE(together[2].status.message().find("--ctx-size"), std::string::npos);
  for (size_t i = 0, j = 0; i < together.size(); ++i) {
    if (i == 2) continue;
    EXPECT_TRUE(together[i].status.ok()) << together[i].status.message();
    EXPECT_EQ(together[i].tokens, alone[j].tokens) << "request " << i;
    ++j;
  }
  EXPECT_GT((*engine)->stats().preemptions, 0);
}

// The prefix cache: a request sharing a finished one's prefix takes its blocks (and says how
// many tokens), and gives exactly what it gives on a fresh engine; copy-on-write keeps the
// cached blocks intact when a prompt ends exactly on a block boundary.
TEST_P(EngineBatching, PrefixCacheReusesBlocksWithoutChangingOutputs) {
  const int64_t B = KvPool::kDefaultBlockSize;
  const int64_t V = model_->config().vocab_size;
  std::vector<int32_t> system(3 * B + 5);
  for (size_t i = 0; i < system.size(); ++i) system[i] = static_cast<int32_t>((i * 7 + 3) % V);
  auto with = [&](std::vector<int32_t> tail) {
    RequestOptions r;
    r.prompt = system;
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.max_new_tokens = 6;
    return r;
  };
  const RequestOptions first = with({5, 6, 7}), second = with({9, 1}), exact = with({});
  RequestOptions aligned;  // exactly 3 blocks, all of them cached after `first`
  aligned.prompt.assign(system.begin(), system.begin() + 3 * B);
  aligned.max_new_tokens = 6;
  const auto alone = Alone({second, aligned, exact});
  auto engine = testing::MakeEngine(*model_, 512);
  const auto a = RunAll(*engine, {first});
  EXPECT_EQ(a[0].usage.cached_tokens, 0);
  const auto b = RunAll(*engine, {second, aligned, exact});
  EXPECT_EQ(b[0].usage.cached_tokens, 3 * B);
  EXPECT_EQ(b[1].usage.cached_tokens, 3 * B - 1);  // the last token runs again, for its logits
  EXPECT_EQ(b[2].usage.cached_tokens, 3 * B);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(b[static_cast<size_t>(i)].tokens, alone[static_cast<size_t>(i)].tokens) << i;
  // After all that, the first request again: its cached blocks were never overwritten.
  const auto again = RunAll(*engine, {first});
  EXPECT_EQ(again[0].tokens, a[0].tokens);
  EXPECT_GE(again[0].usage.cached_tokens, 3 * B);
}

// The host KV tier: a prefix whose blocks the pool evicted comes back from host RAM (copied into
// the pool, not recomputed) and gives exactly the tokens it gives alone; without the tier the
// same prefix is computed again.
// A system prompt's blocks, evicted from a 6-block pool by a filler request, come back from the
// host tier for the next request sharing it (and not without one): the same tokens as alone.
void ExpectHostTierGivesBackEvictedPrefixes(CausalLM& model) {
  const int64_t B = KvPool::kDefaultBlockSize;
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> system(3 * B + 5);
  for (size_t i = 0; i < system.size(); ++i) system[i] = static_cast<int32_t>((i * 7 + 3) % V);
  RequestOptions first, second, filler;
  first.prompt = system;
  first.prompt.insert(first.prompt.end(), {5, 6, 7});
  first.max_new_tokens = 6;
  second.prompt = system;
  second.prompt.insert(second.prompt.end(), {9, 1});
  second.max_new_tokens = 6;
  for (int64_t i = 0; i < 5 * B; ++i)
    filler.prompt.push_back(static_cast<int32_t>((i * 11 + 1) % V));
  filler.max_new_tokens = 2;  // with its prompt, every block of a 6-block pool
  const auto alone = RunAll(*testing::MakeEngine(model, 256), {second});
  ASSERT_TRUE(alone[0].status.ok()) << alone[0].status.message();
  for (const uint64_t host_blocks : {0, 16}) {
    SCOPED_TRACE("host tier of " + std::to_string(host_blocks) + " blocks");
    EngineOptions o;
    o.kv_positions = 6 * B;
    o.max_running = 1;
    o.kv_host_bytes = host_blocks * KvPool::BlockBytes(model.kv_shape(), B, o.kv_dtype);
    auto engine = Engine::Create(model, nullptr, o);
    ASSERT_TRUE(engine.ok()) << engine.message();
    RunAll(**engine, {first});
    RunAll(**engine, {filler});  // evicts the system prompt's blocks from the pool
    const auto b = RunAll(**engine, {second});
    ASSERT_TRUE(b[0].status.ok()) << b[0].status.message();
    EXPECT_EQ(b[0].tokens, alone[0].tokens);
    const EngineStats stats = (*engine)->stats();
    if (host_blocks == 0) {
      EXPECT_EQ(b[0].usage.cached_tokens, 0) << "the pool kept the prefix: nothing was tested";
      EXPECT_EQ(stats.kv_host_blocks_total, 0);
    } else {
      EXPECT_EQ(b[0].usage.cached_tokens, 3 * B);
      EXPECT_EQ(stats.kv_host_restored_tokens, 3 * B);
      EXPECT_EQ(stats.kv_host_blocks_total, 16);
      EXPECT_GT(stats.kv_host_blocks_held, 0);
    }
  }
}

TEST_P(EngineBatching, HostTierGivesBackEvictedPrefixes) {
  ExpectHostTierGivesBackEvictedPrefixes(*model_);
}

// The same with the pool in VRAM (--moe-backend gpu): blocks copied from and to the device.
TEST_P(EngineBatching, HostTierGivesBackEvictedPrefixesOnTheGpu) {
  MT_REQUIRE_GPU();
  LoadOptions o;
  o.residency.backend = Backend::kGpu;
  auto m = LoadCausalLM(testing::HfFixture(GetParam()), o);
  ASSERT_TRUE(m.ok()) << m.message();
  ASSERT_EQ((*m)->device(), ComputeDevice::kGpu);
  ExpectHostTierGivesBackEvictedPrefixes(**m);
}

// The tier's slots: the least recently kept or restored block leaves first when it is full.
TEST(HostKvTier, KeepsTheMostRecentlyUsedBlocks) {
  const KvShape shape{1, 1, 4};
  const int64_t B = 2;
  auto pool = KvPool::Create(shape, 4, B);
  ASSERT_TRUE(pool.ok()) << pool.message();
  auto made = HostKvTier::Create(2, B, pool->block_bytes());
  ASSERT_NE(made, nullptr);
  HostKvTier& tier = *made;
  auto fill = [&](int32_t block, float value) {
    const std::vector<float> rows(static_cast<size_t>(B * shape.row()), value);
    pool->WriteRows(block, 0, 0, B, rows.data(), rows.data());
  };
  const std::vector<std::vector<int32_t>> tokens = {{1, 2}, {3, 4}, {5, 6}};
  for (int32_t i = 0; i < 3; ++i) fill(i, static_cast<float>(i + 1));
  tier.Keep(*pool, 0, 0, KvBlocks::ChainHash(0, tokens[0]), tokens[0]);
  tier.Keep(*pool, 1, 0, KvBlocks::ChainHash(0, tokens[1]), tokens[1]);
  const int32_t slot = tier.Take(0, tokens[0]);  // used again: block 1's copy is now the oldest
  ASSERT_GE(slot, 0);
  ASSERT_TRUE(tier.CopyInto(slot, *pool, 3));
  tier.Release(slot);
  EXPECT_EQ(reinterpret_cast<const float*>(pool->keys(3, 0))[0], 1.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(pool->values(3, 0))[B * shape.row() - 1], 1.0f);
  tier.Keep(*pool, 2, 0, KvBlocks::ChainHash(0, tokens[2]), tokens[2]);
  EXPECT_EQ(tier.n_held(), 2);
  EXPECT_EQ(tier.Take(0, tokens[1]), -1) << "the least recently used left";
  const int32_t kept = tier.Take(0, tokens[2]);
  ASSERT_GE(kept, 0);
  ASSERT_TRUE(tier.CopyInto(kept, *pool, 3));
  tier.Release(kept);
  EXPECT_EQ(reinterpret_cast<const float*>(pool->keys(3, 0))[0], 3.0f);
  const std::vector<int32_t> other = {tokens[0][0], 9};
  EXPECT_EQ(tier.Take(0, other), -1) << "other tokens under the same parent";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineBatching,
                         ::testing::Values("qwen3_moe", "mixtral", "realvocab/qwen3_moe_tiny",
                                           "realvocab/mixtral_tiny"),
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

TEST(Engine, CancelFromAnotherThreadAndErrorsEndOnlyTheirRequest) {
  auto m = LoadCausalLM(testing::HfFixture("qwen3_moe"), testing::WithThreads(1));
  ASSERT_TRUE(m.ok());
  auto engine = testing::MakeEngine(**m, 512, nullptr, 4);
  engine->Start();
  std::atomic<int> tokens{0};
  std::atomic<bool> done_long{false}, done_ok{false};
  StopReason long_reason = StopReason::kMaxTokens;
  RequestOptions endless;
  endless.prompt = {1, 2, 3};
  endless.max_new_tokens = 400;
  const RequestId id = engine->Submit(endless, [&](const RequestEvent& e) {
    if (e.kind == RequestEvent::Kind::kToken) {
      ++tokens;
      return;
    }
    long_reason = e.reason;
    done_long = true;
  });
  RequestOptions bad;  // an empty prompt: an error for this request only
  Status bad_status;
  engine->Submit(bad, [&](const RequestEvent& e) {
    if (e.kind == RequestEvent::Kind::kFinished) bad_status = e.status;
  });
  RequestOptions ok;
  ok.prompt = {4, 5};
  ok.max_new_tokens = 3;
  engine->Submit(ok, [&](const RequestEvent& e) {
    if (e.kind == RequestEvent::Kind::kFinished) done_ok = true;
  });
  while (tokens < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine->Cancel(id);
  for (int i = 0; i < 5000 && !(done_long && done_ok); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine->Stop();
  EXPECT_TRUE(done_long);
  EXPECT_TRUE(done_ok);
  EXPECT_EQ(long_reason, StopReason::kCancelled);
  EXPECT_LT(tokens.load(), 400);
  EXPECT_NE(bad_status.message().find("empty"), std::string::npos) << bad_status.message();
}

// One token's embedding row made NaN: the request whose prompt holds that token ends with the
// error naming the embedding; the requests that shared its steps run them again and give what
// they give alone, whether the bad prompt went in whole or in chunks beside their decoding.
TEST(Engine, ANonFiniteValueEndsOnlyItsSequence) {
  testing::TempDir tmp;
  const std::filesystem::path dir = tmp.path() / "model";
  testing::CopyDir(testing::HfFixture("qwen3_moe"), dir);
  auto clean = LoadCausalLM(dir, testing::WithThreads(1));
  ASSERT_TRUE(clean.ok()) << clean.message();
  const int64_t vocab = (*clean)->config().vocab_size;
  const std::vector<RequestOptions> others = Requests(3, testing::TestSeed(), vocab);
  std::vector<Outcome> alone;
  std::vector<bool> used(static_cast<size_t>(vocab), false);
  for (const RequestOptions& r : others) {
    alone.push_back(RunAll(*testing::MakeEngine(**clean, 256), {r})[0]);
    for (int32_t t : r.prompt) used[static_cast<size_t>(t)] = true;
    for (int32_t t : alone.back().tokens) used[static_cast<size_t>(t)] = true;
  }
  const auto unused = std::find(used.begin(), used.end(), false);
  ASSERT_NE(unused, used.end()) << "every token in use";
  const auto poisoned = static_cast<int32_t>(unused - used.begin());

  const std::filesystem::path weights = dir / "model.safetensors";
  auto tensors = testing::ReadSafetensors(weights);
  testing::TensorSpec& embed = tensors.at("model.embed_tokens.weight");
  ASSERT_EQ(embed.dtype, "BF16");
  const size_t row = static_cast<size_t>(embed.shape[1]) * 2;
  for (size_t i = 0; i < row; i += 2)
    embed.bytes.replace(static_cast<size_t>(poisoned) * row + i, 2, std::string("\xc0\x7f", 2));
  testing::WriteSafetensors(weights, tensors);
  auto m = LoadCausalLM(dir, testing::WithThreads(1));
  ASSERT_TRUE(m.ok()) << m.message();

  RequestOptions bad;
  bad.prompt = {1, 2, poisoned, 3, 4, 5, 6, 7, 8, 9};
  bad.max_new_tokens = 4;
  for (int64_t max_batch_tokens : {4, 64}) {
    SCOPED_TRACE("batch tokens " + std::to_string(max_batch_tokens));
    std::vector<RequestOptions> requests = others;
    bad.arrival_step = 1;  // beside the others' prompts (64) or decoding (4)
    requests.push_back(bad);
    EngineOptions o;
    o.kv_positions = 1024;
    o.max_running = 4;
    o.max_batch_tokens = max_batch_tokens;
    auto engine = Engine::Create(**m, nullptr, o);
    ASSERT_TRUE(engine.ok()) << engine.message();
    const auto together = RunAll(**engine, requests);
    for (size_t i = 0; i < others.size(); ++i) {
      ASSERT_TRUE(together[i].finished);
      EXPECT_TRUE(together[i].status.ok()) << together[i].status.message();
      EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    }
    const Outcome& failed = together.back();
    ASSERT_TRUE(failed.finished);
    EXPECT_NE(failed.status.message().find("the embedding produced a non-finite value"),
              std::string::npos)
        << failed.status.message();
    EXPECT_TRUE(failed.tokens.empty());
  }
}

TEST(KvBlocks, ReferencesCachingAndEviction) {
  KvBlocks blocks(4, 2);
  const int32_t a = blocks.Allocate(), b = blocks.Allocate();
  EXPECT_EQ(blocks.n_available(), 2);
  const std::vector<int32_t> toks = {7, 8, 9, 10};
  const uint64_t ha = KvBlocks::ChainHash(0, std::span(toks).subspan(0, 2));
  const uint64_t hb = KvBlocks::ChainHash(ha, std::span(toks).subspan(2, 2));
  blocks.Register(a, 0, ha, std::span(toks).subspan(0, 2));
  blocks.Register(b, ha, hb, std::span(toks).subspan(2, 2));
  EXPECT_TRUE(blocks.IsShared(a));  // registered: immutable
  blocks.Unref(a);
  blocks.Unref(b);
  EXPECT_EQ(blocks.n_available(), 4);  // cached and idle count as available
  EXPECT_EQ(blocks.n_cached(), 2);
  std::vector<int32_t> got;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(blocks.Match(toks, 8, got, hashes), 2);
  EXPECT_EQ(got, (std::vector<int32_t>{a, b}));
  EXPECT_EQ(hashes, (std::vector<uint64_t>{ha, hb}));
  EXPECT_EQ(blocks.refs(a), 1);
  // A different second block matches only the first.
  const std::vector<int32_t> other = {7, 8, 1, 1};
  got.clear();
  hashes.clear();
  EXPECT_EQ(blocks.Match(other, 8, got, hashes), 1);
  blocks.Unref(a);
  blocks.Unref(a);
  blocks.Unref(b);
  // Allocation takes free blocks first, then the least recently used cached one.
  const int32_t c = blocks.Allocate(), d = blocks.Allocate(), e = blocks.Allocate();
  EXPECT_NE(c, a);
  EXPECT_NE(d, a);
  EXPECT_EQ(e, a);  // released before b
  EXPECT_EQ(blocks.n_cached(), 1);
  got.clear();
  hashes.clear();
  EXPECT_EQ(blocks.Match(toks, 8, got, hashes), 0);  // the chain's first block is gone
  EXPECT_EQ(blocks.Allocate(), b);
  EXPECT_EQ(blocks.Allocate(), -1);
}

// Free blocks go out last in, first out, so the pool's memory is touched only as far as it
// has ever been full: n_touched is that high-water mark.
TEST(KvBlocks, TouchedCountsBlocksEverHandedOut) {
  KvBlocks blocks(8, 1);
  EXPECT_EQ(blocks.n_touched(), 0);
  for (int round = 0; round < 100; ++round) {  // unregistered: the same block every time
    const int32_t b = blocks.Allocate();
    blocks.Unref(b);
  }
  EXPECT_EQ(blocks.n_touched(), 1);
  const int32_t a = blocks.Allocate(), b = blocks.Allocate(), c = blocks.Allocate();
  EXPECT_EQ(blocks.n_touched(), 3);
  blocks.Unref(b);
  blocks.Unref(a);
  blocks.Unref(c);
  EXPECT_EQ(blocks.n_touched(), 3);
  // Cached blocks keep theirs: new ones are touched until the pool is, then the cache yields.
  for (int32_t round = 0; round < 20; ++round) {
    const int32_t x = blocks.Allocate();
    ASSERT_GE(x, 0);
    const std::vector<int32_t> t = {round};
    blocks.Register(x, 0, KvBlocks::ChainHash(0, t), t);
    blocks.Unref(x);
    EXPECT_EQ(blocks.n_touched(), std::max<int64_t>(3, std::min<int64_t>(8, round + 1)));
  }
}

TEST(KvBlocks, ManyEvictionsKeepTheTableUsable) {
  KvBlocks blocks(8, 1);
  for (int32_t round = 0; round < 1000; ++round) {
    const int32_t b = blocks.Allocate();
    ASSERT_GE(b, 0);
    const std::vector<int32_t> t = {round};
    blocks.Register(b, 0, KvBlocks::ChainHash(0, t), t);
    blocks.Unref(b);
  }
  EXPECT_EQ(blocks.n_cached(), 8);
  std::vector<int32_t> got;
  std::vector<uint64_t> hashes;
  const std::vector<int32_t> last = {999}, gone = {3};
  EXPECT_EQ(blocks.Match(last, 1, got, hashes), 1);
  EXPECT_EQ(blocks.Match(gone, 1, got, hashes), 0);
}

}  // namespace
}  // namespace moetier
