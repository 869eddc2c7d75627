// The engine's log-probabilities (RequestOptions::top_logprobs, prompt_logprobs) against the
// log-softmax of the model's own logits, from rows, from candidates and log-sum-exps, and on the
// GPU; and the OpenAI logit bias (SamplerOptions::logit_bias) inside a batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_fixture.h"
#include "engine/logprobs.h"
#include "support/candidates_model.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier {
namespace {

using engine_testing::EachAlone;
using engine_testing::EngineBatching;
using engine_testing::Outcome;
using engine_testing::Requests;

// `lp` against the log-softmax of `row` (V logits), recomputed here in double precision within
// `tolerance`: `token`'s log-probability, and `n_top` alternatives, most likely first, nothing
// outside them more likely than the last.
void ExpectLogprobsOfRow(const TokenLogprobs& lp, const float* row, int64_t V, int32_t token,
                         int n_top, double tolerance) {
  double max = row[0], sum = 0;
  for (int64_t v = 0; v < V; ++v) max = std::max(max, static_cast<double>(row[v]));
  for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
  const double log_z = max + std::log(sum);
  EXPECT_EQ(lp.chosen.token, token);
  EXPECT_NEAR(lp.chosen.logprob, row[token] - log_z, tolerance);
  ASSERT_EQ(lp.top.size(), static_cast<size_t>(n_top));
  for (size_t k = 0; k < lp.top.size(); ++k) {
    EXPECT_NEAR(lp.top[k].logprob, row[lp.top[k].token] - log_z, tolerance);
    if (k > 0) {
      EXPECT_GE(lp.top[k - 1].logprob, lp.top[k].logprob);
    }
  }
  if (lp.top.empty()) return;
  int n_above = 0;
  for (int64_t v = 0; v < V; ++v) n_above += row[v] - log_z > lp.top.back().logprob + tolerance;
  EXPECT_LT(n_above, static_cast<int>(lp.top.size()));
}

// Requests asking for log-probabilities (greedy and sampled, one with top-k, batched together,
// one asking for none) on `model`: each generated token's log-probability and alternatives are
// the log-softmax of the logits `reference` gives that sequence alone (recomputed here in
// double precision), within `tolerance`; the alternatives come most likely first, a greedy token
// the first of them. With `same_tokens`, asking changes no token (against the same requests
// alone on `reference`, asking none). `device_draws`: EngineOptions::device_draws.
void ExpectLogprobsOfTheLogits(CausalLM& model, CausalLM& reference, double tolerance,
                               bool same_tokens, std::optional<bool> device_draws = {}) {
  const uint32_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t V = model.config().vocab_size;
  auto requests = Requests(5, seed, V);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < requests.size(); ++i) {
    // Sampled requests are drawn on a GPU's device, asking or not (request 4 asks for none), so
    // steps that hold them hand back candidates with log-sum-exps (Engine::RowLogprobs).
    if (i % 2 == 1 || i == 4) {
      requests[i].sampler.temperature = 0.8f;
      requests[i].sampler.seed = rng();
    }
    if (i == 3) requests[i].sampler.top_k = 40;  // drawn from its candidates
    requests[i].top_logprobs = i == 4 ? -1 : static_cast<int>(rng() % (kMaxTopLogprobs + 1));
  }
  requests[0].top_logprobs = kMaxTopLogprobs;
  std::vector<std::vector<TokenLogprobs>> got(requests.size());
  std::vector<Outcome> out(requests.size());
  EngineOptions o;
  o.kv_positions = 1024;
  o.max_running = static_cast<int>(requests.size());
  o.max_batch_tokens = 16;
  o.device_draws = device_draws;
  auto engine = Engine::Create(model, nullptr, o);
  ASSERT_TRUE(engine.ok()) << engine.message();
  for (size_t i = 0; i < requests.size(); ++i)
    (*engine)->Submit(requests[i], [&, i](const RequestEvent& e) {
      if (e.kind == RequestEvent::Kind::kFinished) {
        out[i].finished = true;
        out[i].status = e.status;
        return;
      }
      out[i].tokens.push_back(e.token);
      EXPECT_EQ(e.logprobs != nullptr, requests[i].top_logprobs >= 0) << "request " << i;
      if (e.logprobs != nullptr) got[i].push_back(*e.logprobs);
    });
  (*engine)->RunUntilIdle();

  std::vector<Outcome> alone;
  if (same_tokens) {
    std::vector<RequestOptions> without = requests;
    for (auto& r : without) r.top_logprobs = -1;
    alone = EachAlone(reference, without);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_TRUE(out[i].finished && out[i].status.ok()) << out[i].status.message();
    if (same_tokens) {
      EXPECT_EQ(out[i].tokens, alone[i].tokens) << "asking for log-probabilities changed a token";
    }
    if (requests[i].top_logprobs < 0) continue;
    ASSERT_EQ(got[i].size(), out[i].tokens.size());
    std::vector<int32_t> seq = requests[i].prompt;
    seq.insert(seq.end(), out[i].tokens.begin(), out[i].tokens.end());
    KvCache cache = *reference.NewCache(static_cast<int64_t>(seq.size()));
    std::vector<float> logits;
    ASSERT_TRUE(reference.Forward(seq, cache, LogitsFor::kAllTokens, logits).ok());
    for (size_t t = 0; t < out[i].tokens.size(); ++t) {
      SCOPED_TRACE("token " + std::to_string(t));
      const TokenLogprobs& lp = got[i][t];
      ExpectLogprobsOfRow(lp, logits.data() + (requests[i].prompt.size() - 1 + t) * V, V,
                          out[i].tokens[t], requests[i].top_logprobs, tolerance);
      if (requests[i].sampler.temperature == 0.0f && !lp.top.empty()) {
        EXPECT_EQ(lp.top[0].token, out[i].tokens[t]) << "greedy: the most likely";
      }
    }
  }
}

// The engine's rows and the reference's are computed at other batch sizes: equal but for the
// last bits where AMX tiles sum a batch (batch_identity_test.cpp).
TEST_P(EngineBatching, LogprobsAreTheLogSoftmaxOfTheSequencesLogits) {
  ExpectLogprobsOfTheLogits(*model_, *model_, 1e-4, /*same_tokens=*/true);
}

// Where steps end in candidates, as on a GPU (testing::CandidatesModel: the CPU's candidates and
// log-sum-exps), the log-probabilities come from them: the same values, within the CPU's
// rounding, and the same tokens.
TEST_P(EngineBatching, LogprobsFromCandidatesAndLogSumExps) {
  testing::CandidatesModel m(*model_);
  ExpectLogprobsOfTheLogits(m, *model_, 1e-4, /*same_tokens=*/true, /*device_draws=*/false);
  EXPECT_GT(m.scored_steps(), 0) << "no step ended in candidates with log-sum-exps";
  EXPECT_EQ(m.rows_read(), 0) << "a row read where its candidates and sums sufficed";
}

// On the GPU, where rows are handed back as arg-max ids or candidates unless read whole: the
// log-probabilities against the CPU engine's logits, within the GPU's rounding of them
// (gpu_placement_test.cpp: 4.1e-7 of the logits' scale). Its greedy tokens follow its own
// logits, so they are not compared with the CPU's.
TEST_P(EngineBatching, LogprobsOnTheGpu) {
  MT_REQUIRE_GPU();
  auto m = OnTheGpu();
  ASSERT_TRUE(m.ok()) << m.message();
  ASSERT_TRUE((*m)->CandidatesOnDevice());
  ExpectLogprobsOfTheLogits(**m, *model_, 1e-3, /*same_tokens=*/false);
}

// On the GPU, asking for log-probabilities changes no token: greedy, sampled with top-k (drawn
// from candidates) and sampled over the whole vocabulary (drawn on the device), asking for
// alternatives or not, give the tokens the same requests give asking for none, batched alike.
TEST_P(EngineBatching, AskingForLogprobsChangesNoTokenOnTheGpu) {
  MT_REQUIRE_GPU();
  auto m = OnTheGpu();
  ASSERT_TRUE(m.ok()) << m.message();
  const uint32_t seed = testing::TestSeed();
  auto requests = Requests(6, seed, (*m)->config().vocab_size);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplerOptions& s = requests[i].sampler;
    s.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    s.top_k = i % 3 == 1 ? 30 : 0;
    s.top_p = i == 5 ? 0.9f : 1.0f;
    s.seed = rng();
    requests[i].top_logprobs = i < 3 ? 0 : 5;
  }
  std::vector<RequestOptions> without = requests;
  for (auto& r : without) r.top_logprobs = -1;
  EngineOptions o;
  o.kv_positions = 1024;
  o.max_running = static_cast<int>(requests.size());
  o.max_batch_tokens = 512;
  std::vector<Outcome> runs[2];
  for (int asking = 0; asking < 2; ++asking) {
    auto engine = Engine::Create(**m, nullptr, o);
    ASSERT_TRUE(engine.ok()) << engine.message();
    runs[asking] = engine_testing::RunAll(**engine, asking == 1 ? requests : without);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(runs[0][i].status.ok() && runs[1][i].status.ok()) << "request " << i;
    EXPECT_EQ(runs[1][i].tokens, runs[0][i].tokens) << "request " << i;
  }
}

// Prompt log-probabilities (RequestOptions::prompt_logprobs): every prompt token from the second
// (or from first_prompt_logprob) is given once, in order, before the first generated token, as the
// log-softmax of the logits the model gives the prompt alone at the position before it — whatever
// the prefill chunks, a preemption in mid-prompt, or a prefix the cache holds (such a prompt takes
// none of it) — and the tokens generated are those of the same request asking for nothing (with
// `same_tokens`, on `reference`). The values against `reference`'s logits for the prompt alone,
// within `tolerance`, or `prefill_tolerance` where a step may hold more tokens than a GPU's
// decode kernels take (cuda::DenseMatMul::kMaxDecodeTokens: beyond them, products of bf16
// operands). `device_draws`: EngineOptions::device_draws.
constexpr int64_t kDecodeTokens = 64;  // cuda::DenseMatMul::kMaxDecodeTokens
void ExpectPromptLogprobs(CausalLM& model, CausalLM& reference, double tolerance,
                          double prefill_tolerance, bool same_tokens,
                          std::optional<bool> device_draws = {}) {
  const uint32_t seed = testing::TestSeed();
  const int64_t V = model.config().vocab_size;
  auto requests = Requests(4, seed, V);
  std::mt19937 rng(seed);
  for (auto& r : requests) {
    r.top_logprobs = static_cast<int>(rng() % 4);
    r.prompt_logprobs = true;
  }
  requests[1].prompt = requests[0].prompt;  // the second finds the first's blocks cached
  requests[2].first_prompt_logprob = 1 + static_cast<int64_t>(requests[2].prompt.size() / 2);
  std::vector<RequestOptions> without = requests;
  for (auto& r : without) {
    r.top_logprobs = -1;
    r.prompt_logprobs = false;
  }
  const auto alone = same_tokens ? EachAlone(reference, without) : std::vector<Outcome>{};
  for (int64_t max_batch_tokens : {3, 512}) {
    for (int64_t kv_positions : {48, 1024}) {  // 48: three blocks, so prompts are preempted
      SCOPED_TRACE("batch tokens " + std::to_string(max_batch_tokens) + ", pool " +
                   std::to_string(kv_positions));
      EngineOptions o;
      o.kv_positions = kv_positions;
      o.max_running = 2;
      o.max_batch_tokens = max_batch_tokens;
      o.device_draws = device_draws;
      auto engine = Engine::Create(model, nullptr, o);
      ASSERT_TRUE(engine.ok()) << engine.message();
      std::vector<std::vector<TokenLogprobs>> got(requests.size());
      std::vector<Outcome> out(requests.size());
      for (size_t i = 0; i < requests.size(); ++i)
        (*engine)->Submit(requests[i], [&, i](const RequestEvent& e) {
          if (e.kind == RequestEvent::Kind::kPromptLogprobs) {
            EXPECT_TRUE(out[i].tokens.empty()) << "prompt log-probabilities after a token";
            EXPECT_EQ(e.first_prompt_token,
                      requests[i].first_prompt_logprob + static_cast<int64_t>(got[i].size()))
                << "request " << i << ": given out of order or twice";
            got[i].insert(got[i].end(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
          } else if (e.kind == RequestEvent::Kind::kToken) {
            out[i].tokens.push_back(e.token);
          } else {
            out[i].finished = true;
            out[i].status = e.status;
            out[i].reason = e.reason;
          }
        });
      (*engine)->RunUntilIdle();
      for (size_t i = 0; i < requests.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        const auto& prompt = requests[i].prompt;
        if (!out[i].status.ok()) {  // a prompt longer than the small pool: refused
          EXPECT_EQ(out[i].reason, StopReason::kContextFull) << out[i].status.message();
          EXPECT_GT(static_cast<int64_t>(prompt.size()) + 16, kv_positions);
          continue;
        }
        if (same_tokens &&
            out[i].reason == StopReason::kContextFull) {  // the small pool filled: a prefix
          ASSERT_LE(out[i].tokens.size(), alone[i].tokens.size());
          EXPECT_TRUE(
              std::equal(out[i].tokens.begin(), out[i].tokens.end(), alone[i].tokens.begin()));
        } else if (same_tokens) {
          EXPECT_EQ(out[i].tokens, alone[i].tokens);
        }
        const auto first = static_cast<size_t>(requests[i].first_prompt_logprob);
        ASSERT_EQ(got[i].size(), prompt.size() - first);
        KvCache cache = *reference.NewCache(static_cast<int64_t>(prompt.size()));
        std::vector<float> logits;
        ASSERT_TRUE(reference.Forward(prompt, cache, LogitsFor::kAllTokens, logits).ok());
        for (size_t j = first; j < prompt.size(); ++j) {
          SCOPED_TRACE("prompt token " + std::to_string(j));
          ExpectLogprobsOfRow(got[i][j - first], logits.data() + (j - 1) * V, V, prompt[j],
                              requests[i].top_logprobs,
                              max_batch_tokens > kDecodeTokens ? prefill_tolerance : tolerance);
        }
      }
    }
  }
}

TEST_P(EngineBatching, PromptLogprobsCoverEveryPromptTokenOnce) {
  ExpectPromptLogprobs(*model_, *model_, 1e-4, 1e-4, /*same_tokens=*/true);
}

// The same from candidates and log-sum-exps, as on a GPU (testing::CandidatesModel).
TEST_P(EngineBatching, PromptLogprobsFromCandidatesAndLogSumExps) {
  testing::CandidatesModel m(*model_);
  ExpectPromptLogprobs(m, *model_, 1e-4, 1e-4, /*same_tokens=*/true, /*device_draws=*/false);
  EXPECT_GT(m.scored_steps(), 0) << "no step ended in candidates with log-sum-exps";
  EXPECT_EQ(m.rows_read(), 0) << "a row read where its candidates and sums sufficed";
}

// The same on the GPU (each row's log-sum-exp taken there), against the CPU's logits: within
// 1e-3 on its decode kernels; steps of more tokens multiply on bf16 operands (within 1e-2 of a
// product's magnitude, dense.h; 6.6e-3 seen on a log-probability), 2e-2.
TEST_P(EngineBatching, PromptLogprobsOnTheGpu) {
  MT_REQUIRE_GPU();
  auto m = OnTheGpu();
  ASSERT_TRUE(m.ok()) << m.message();
  ExpectPromptLogprobs(**m, *model_, 1e-3, 2e-2, /*same_tokens=*/false);
}

// A long prompt's log-probabilities come in steps of at most 256 rows, whatever
// --max-batch-tokens allows (each row is a vocabulary of floats), every token once; positions
// whose row is not wanted (before first_prompt_logprob) do not count against the 256.
TEST_P(EngineBatching, PromptLogprobsOfALongPromptComeInBoundedSteps) {
  const uint32_t seed = testing::TestSeed();
  std::mt19937 rng(seed);
  RequestOptions r;
  for (int i = 0; i < 600; ++i)
    r.prompt.push_back(static_cast<int32_t>(rng() % model_->config().vocab_size));
  r.max_new_tokens = 1;
  r.top_logprobs = 0;
  r.prompt_logprobs = true;
  for (int64_t first : {1, 300}) {
    SCOPED_TRACE("from prompt token " + std::to_string(first));
    r.first_prompt_logprob = first;
    EngineOptions o;
    o.kv_positions = 1024;
    o.max_batch_tokens = 1024;
    auto engine = Engine::Create(*model_, nullptr, o);
    ASSERT_TRUE(engine.ok()) << engine.message();
    std::vector<size_t> sizes;
    int64_t given = 0;
    Status status;
    (*engine)->Submit(r, [&](const RequestEvent& e) {
      if (e.kind == RequestEvent::Kind::kPromptLogprobs) {
        EXPECT_EQ(e.first_prompt_token, first + given);
        given += static_cast<int64_t>(e.prompt_logprobs.size());
        sizes.push_back(e.prompt_logprobs.size());
      }
      if (e.kind == RequestEvent::Kind::kFinished) status = e.status;
    });
    (*engine)->RunUntilIdle();
    ASSERT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(given, 600 - first);
    ASSERT_FALSE(sizes.empty());
    EXPECT_EQ(sizes.front(), 256u) << "the first step fills its 256 rows";
    EXPECT_LE(*std::max_element(sizes.begin(), sizes.end()), 256u);
  }
}

// The logit bias inside a batch of greedy requests: one that bans its own first token gives the
// next most likely (by `reference`'s logits, with `exact`), one that forces a token with +100
// (sampled) gives only that token, one naming a token outside the vocabulary is refused naming
// logit_bias, and the requests beside them (whose steps then read rows, not the arg-max) give
// what they give alone (with `exact`: a GPU's rows follow the batch's size in their last bits).
void ExpectLogitBiasInABatch(CausalLM& model, CausalLM& reference, bool exact) {
  const uint32_t seed = testing::TestSeed();
  const int64_t V = model.config().vocab_size;
  auto requests = Requests(5, seed, V);
  const std::vector<Outcome> alone = EachAlone(model, requests);
  ASSERT_EQ(alone.size(), requests.size());
  const int32_t banned = alone[1].tokens[0];
  const auto forced = static_cast<int32_t>((alone[2].tokens[0] + 1) % V);
  requests[1].sampler.logit_bias = {{banned, -kMaxLogitBias}};
  requests[2].sampler.logit_bias = {{forced, kMaxLogitBias}, {banned, -3.0f}};
  requests[2].sampler.temperature = 0.9f;
  requests[2].sampler.seed = seed;
  requests[4].sampler.logit_bias = {{static_cast<int32_t>(V), 1.0f}};
  EngineOptions o;
  o.kv_positions = 1024;
  o.max_running = static_cast<int>(requests.size());
  o.max_batch_tokens = 16;
  auto engine = Engine::Create(model, nullptr, o);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<Outcome> out = engine_testing::RunAll(**engine, requests);
  for (size_t i : {size_t{0}, size_t{3}}) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status.message();
    if (exact) {
      EXPECT_EQ(out[i].tokens, alone[i].tokens) << "request " << i;
    }
  }
  ASSERT_TRUE(out[1].status.ok()) << out[1].status.message();
  ASSERT_FALSE(out[1].tokens.empty());
  EXPECT_NE(out[1].tokens[0], banned);
  if (exact) {
    KvCache cache = *reference.NewCache(static_cast<int64_t>(requests[1].prompt.size()));
    std::vector<float> logits;
    ASSERT_TRUE(reference.Forward(requests[1].prompt, cache, LogitsFor::kLastToken, logits).ok());
    logits[static_cast<size_t>(banned)] = -INFINITY;
    EXPECT_EQ(out[1].tokens[0], std::max_element(logits.begin(), logits.end()) - logits.begin())
        << "the next most likely";
  }
  ASSERT_TRUE(out[2].status.ok()) << out[2].status.message();
  EXPECT_EQ(out[2].tokens, std::vector<int32_t>(out[2].tokens.size(), forced));
  EXPECT_FALSE(out[4].status.ok());
  EXPECT_NE(out[4].status.message().find("logit_bias"), std::string::npos)
      << out[4].status.message();
}

TEST_P(EngineBatching, LogitBiasBansAndForcesTokensOfItsRequestOnly) {
  ExpectLogitBiasInABatch(*model_, *model_, /*exact=*/true);
}

TEST_P(EngineBatching, LogitBiasOnTheGpu) {
  MT_REQUIRE_GPU();
  auto m = OnTheGpu();
  ASSERT_TRUE(m.ok()) << m.message();
  ExpectLogitBiasInABatch(**m, *model_, /*exact=*/false);
}

}  // namespace
}  // namespace moetier
