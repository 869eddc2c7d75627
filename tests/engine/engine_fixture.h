// What the engine's tests share: requests, running them, what each gives alone, and the
// EngineBatching fixture (each Hugging Face fixture model on the CPU, and where asked on the GPU),
// whose tests live in engine_test.cpp and engine_logprobs_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "model/causal_lm.h"
#include "support/test_support.h"

namespace moetier::engine_testing {

struct Outcome {
  std::vector<int32_t> tokens;
  StopReason reason = StopReason::kMaxTokens;
  Status status;
  RequestUsage usage;
  bool finished = false;
};

// Submits every request with its sink, drives the engine, and returns each outcome.
inline std::vector<Outcome> RunAll(Engine& engine, const std::vector<RequestOptions>& requests) {
  std::vector<Outcome> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    engine.Submit(requests[i], [&out, i](const RequestEvent& e) {
      if (e.kind == RequestEvent::Kind::kToken) {
        out[i].tokens.push_back(e.token);
        return;
      }
      out[i].finished = true;
      out[i].reason = e.reason;
      out[i].status = e.status;
      out[i].usage = e.usage;
    });
  engine.RunUntilIdle();
  return out;
}

// Prompts of several lengths (a shared start for some), greedy, fixed lengths.
inline std::vector<RequestOptions> Requests(int n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(21);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % vocab);
  std::vector<RequestOptions> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const size_t len = 3 + rng() % 40;
    if (i % 3 == 1) r[static_cast<size_t>(i)].prompt = shared;
    while (r[static_cast<size_t>(i)].prompt.size() < len)
      r[static_cast<size_t>(i)].prompt.push_back(static_cast<int32_t>(rng() % vocab));
    r[static_cast<size_t>(i)].max_new_tokens = 4 + static_cast<int64_t>(rng() % 8);
  }
  return r;
}

// What each request gives alone, on a fresh engine with room for it.
inline std::vector<Outcome> EachAlone(CausalLM& model,
                                      const std::vector<RequestOptions>& requests) {
  std::vector<Outcome> out;
  EngineOptions o;
  o.kv_positions = 256;
  o.max_running = 1;
  for (const auto& r : requests) {
    auto engine = Engine::Create(model, nullptr, o);
    EXPECT_TRUE(engine.ok()) << engine.message();
    if (!engine.ok()) return out;
    out.push_back(RunAll(**engine, {r})[0]);
    EXPECT_TRUE(out.back().status.ok()) << out.back().status.message();
  }
  return out;
}

class EngineBatching : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto m = LoadCausalLM(testing::HfFixture(GetParam()), testing::WithThreads(2));
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value();
  }
  // What each request gives alone, on a fresh engine with room for it.
  std::vector<Outcome> Alone(const std::vector<RequestOptions>& requests) {
    return EachAlone(*model_, requests);
  }
  // The fixture with every weight in VRAM (callers check for a GPU first).
  static Expected<std::unique_ptr<CausalLM>> OnTheGpu() {
    LoadOptions lo;
    lo.residency.backend = Backend::kGpu;
    return LoadCausalLM(testing::HfFixture(GetParam()), lo);
  }
  std::unique_ptr<CausalLM> model_;
};

}  // namespace moetier::engine_testing
