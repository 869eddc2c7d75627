// The decode loop allocates nothing in steady state: after warm-up steps, further
// single-token Forward calls make no call to operator new, whichever thread would make it
// (the pool's workers included). Its own executable: it replaces the global operator new.
#include <execinfo.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "engine/engine.h"
#include "model/causal_lm.h"
#include "support/test_support.h"

// GCC sees the replaced operator delete's free() inlined next to gtest's `new` and warns of a
// mismatch that the replacement itself rules out (both sides are ours, malloc/free).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
// Where the first counted allocation came from (backtrace() allocates with malloc, not new).
constexpr int kMaxFrames = 48;
void* g_first_frames[kMaxFrames];
int g_n_first_frames = 0;
}  // namespace

// Every replaceable non-aligned form, so that no pair mixes ours with the runtime's (ASan
// checks that what `new` returned is released by the matching `delete`).
namespace {
void* CountedAlloc(std::size_t n) noexcept {
  if (g_counting.load(std::memory_order_relaxed) && g_allocations.fetch_add(1) == 0)
    g_n_first_frames = backtrace(g_first_frames, kMaxFrames);
  return std::malloc(n == 0 ? 1 : n);
}

// The first counted allocation's call stack on stderr (addresses as object+offset where the
// binary is stripped: addr2line -e <unstripped binary> resolves them).
void PrintFirstAllocation() {
  if (g_allocations.load() == 0 || g_n_first_frames == 0) return;
  std::fprintf(stderr, "the first counted operator new was called from:\n");
  backtrace_symbols_fd(g_first_frames, g_n_first_frames, 2);
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return CountedAlloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return CountedAlloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace moetier {
namespace {

TEST(DecodeAllocationsCounter, SeesAnAllocation) {
  g_allocations = 0;
  g_counting = true;
  auto* p = new std::vector<int>(100);
  g_counting = false;
  delete p;
  EXPECT_EQ(g_allocations.load(), 2);  // the vector object and its buffer
}

class DecodeAllocations : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeAllocations, NoneInSteadyStateDecodeSteps) {
  LoadOptions opts;
  opts.n_threads = 2;
  auto model = LoadCausalLM(testing::HfFixture(GetParam()), opts);
  ASSERT_TRUE(model.ok()) << model.message();
  CausalLM& lm = **model;
  // Room for every position up front, so the cache never grows during the counted steps.
  KvCache cache = *lm.NewCache(64);
  ASSERT_TRUE(cache.Reserve(64).ok());
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {1, 5, 9, 14, 3, 7, 2, 11};
  ASSERT_TRUE(lm.Forward(prompt, cache, LogitsFor::kLastToken, logits).ok());
  int32_t next = 4;
  // Warm-up: per-thread scratch (attention scores, kernel tiles) reaches its size here.
  for (int i = 0; i < 24; ++i) {
    const int32_t one[1] = {next};
    ASSERT_TRUE(lm.Forward(one, cache, LogitsFor::kLastToken, logits).ok());
    next = (next * 7 + 3) % 100;
  }
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 4; ++i) {
    const int32_t one[1] = {next};
    const Status s = lm.Forward(one, cache, LogitsFor::kLastToken, logits);
    if (!s.ok()) {
      g_counting = false;
      FAIL() << s.message();
    }
    next = (next * 7 + 3) % 100;
  }
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0) << GetParam();
  PrintFirstAllocation();
}

// The same with many sequences decoding together on the engine: once every prompt is in and the
// per-thread scratch has grown, whole engine steps (schedule, forward, sampling, events) make no
// call to operator new.
TEST_P(DecodeAllocations, NoneInSteadyStateBatchedDecodeSteps) {
  auto model = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(2));
  ASSERT_TRUE(model.ok()) << model.message();
  constexpr int kSequences = 6;
  auto engine = testing::MakeEngine(**model, 1024, nullptr, kSequences);
  long during = -1;
  int tokens_of_first = 0;
  for (int i = 0; i < kSequences; ++i) {
    RequestOptions r;
    for (int t = 0; t < 5 + 3 * i; ++t) r.prompt.push_back((t * 13 + i * 7) % 100);
    r.max_new_tokens = 60;
    engine->Submit(std::move(r), [&, i](const RequestEvent& e) {
      if (i != 0 || e.kind != RequestEvent::Kind::kToken) return;
      // Request 0's tokens mark the steps: count over steps 40 to 48.
      if (++tokens_of_first == 40) {
        g_allocations = 0;
        g_counting = true;
      } else if (tokens_of_first == 48) {
        g_counting = false;
        during = g_allocations.load();
      }
    });
  }
  engine->RunUntilIdle();
  g_counting = false;
  EXPECT_EQ(during, 0) << GetParam();
  if (during > 0) PrintFirstAllocation();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeAllocations, ::testing::Values("qwen3_moe", "mixtral"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace moetier
