// The sampler against a direct implementation of Hugging Face's logits processors, and its
// determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/sampler.h"
#include "kernels/cpu/elementwise.h"

namespace moetier {
namespace {

// Hugging Face's pipeline written out plainly: the set of tokens that may be drawn and their
// probabilities.
std::map<int32_t, double> Reference(std::vector<float> l, const SamplerOptions& o,
                                    const std::vector<int32_t>& ctx) {
  std::vector<float> orig = l;
  for (int32_t id : ctx)
    l[id] = orig[id] < 0 ? orig[id] * o.repetition_penalty : orig[id] / o.repetition_penalty;
  for (float& v : l) v /= o.temperature;
  std::vector<bool> keep(l.size(), true);
  if (o.top_k > 0) {
    std::vector<float> s = l;
    std::sort(s.rbegin(), s.rend());
    for (size_t i = 0; i < l.size(); ++i) keep[i] = l[i] >= s[static_cast<size_t>(o.top_k - 1)];
  }
  auto probs = [&] {
    double m = -1e30, z = 0;
    for (size_t i = 0; i < l.size(); ++i)
      if (keep[i]) m = std::max(m, static_cast<double>(l[i]));
    std::vector<double> p(l.size(), 0.0);
    for (size_t i = 0; i < l.size(); ++i)
      if (keep[i]) z += (p[i] = std::exp(l[i] - m));
    for (double& v : p) v /= z;
    return p;
  };
  if (o.top_p < 1.0f) {
    auto p = probs();
    std::vector<size_t> order(l.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double acc = 0;
    bool done = false;
    for (size_t i : order) {
      if (!keep[i]) continue;
      if (done) keep[i] = false;
      acc += p[i];
      if (acc >= o.top_p) done = true;
    }
  }
  if (o.min_p > 0.0f) {
    auto p = probs();
    const double top = *std::max_element(p.begin(), p.end());
    for (size_t i = 0; i < l.size(); ++i)
      if (p[i] < o.min_p * top) keep[i] = false;
  }
  auto p = probs();
  std::map<int32_t, double> out;
  for (size_t i = 0; i < l.size(); ++i)
    if (keep[i]) out[static_cast<int32_t>(i)] = p[i];
  return out;
}

TEST(Sampler, DrawsFollowTheReferenceDistribution) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));  // a failure replays with this seed
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(40);
  for (float& v : logits) v = dist(rng);
  const std::vector<int32_t> ctx = {3, 3, 7, 11};
  const SamplerOptions cases[] = {
      {1.0f, 0, 1.0f, 0.0f, 1.0f, 0},   {0.7f, 5, 1.0f, 0.0f, 1.0f, 0},
      {1.3f, 0, 0.8f, 0.0f, 1.0f, 0},   {1.0f, 0, 1.0f, 0.1f, 1.0f, 0},
      {0.9f, 10, 0.9f, 0.05f, 1.3f, 0},
  };
  for (SamplerOptions o : cases) {
    o.seed = rng();
    const auto want = Reference(logits, o, ctx);
    Sampler s(o);
    std::map<int32_t, int> counts;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++counts[*s.Sample(logits, ctx)];
    for (const auto& [id, c] : counts) ASSERT_TRUE(want.count(id)) << "drew excluded token " << id;
    for (const auto& [id, p] : want) {
      const double sd = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(static_cast<double>(counts[id]) / n, p, 5 * sd + 1e-3)
          << "token " << id << " top_k " << o.top_k << " top_p " << o.top_p;
    }
  }
}

// A vocabulary the size of a real one, a few likely tokens over a long tail: top-p cuts far down
// an order the sampler finds without sorting every token, and a plain draw takes no order at all.
TEST(Sampler, LargeVocabularyDrawsFollowTheReferenceDistribution) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> tail(0.0f, 1.5f), head(6.0f, 1.5f);
  std::vector<float> logits(20000);
  for (float& v : logits) v = tail(rng);
  for (int i = 0; i < 25; ++i) logits[rng() % logits.size()] = head(rng);
  const SamplerOptions cases[] = {
      {1.0f, 0, 0.9f, 0.0f, 1.0f, 0},  {0.7f, 0, 0.5f, 0.02f, 1.0f, 0},
      {1.0f, 0, 1.0f, 0.0f, 1.0f, 0},  {1.0f, 0, 1.0f, 0.05f, 1.0f, 0},
      {0.8f, 30, 1.0f, 0.0f, 1.0f, 0},
  };
  for (SamplerOptions o : cases) {
    o.seed = rng();
    const auto want = Reference(logits, o, {});
    Sampler s(o);
    std::map<int32_t, int> counts;
    const int n = 5000;
    for (int i = 0; i < n; ++i) ++counts[*s.Sample(logits)];
    for (const auto& [id, c] : counts) ASSERT_TRUE(want.count(id)) << "drew excluded token " << id;
    for (const auto& [id, p] : want) {
      const double sd = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(static_cast<double>(counts[id]) / n, p, 5 * sd + 1e-3)
          << "token " << id << " top_p " << o.top_p << " min_p " << o.min_p;
    }
  }
}

// Top-k keeps every token tied with the k-th largest logit (Hugging Face's threshold): logits
// from a small set over a large vocabulary put dozens of tokens at the cut.
TEST(Sampler, TopKKeepsEveryTieOfTheKthLogit) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(0, 40);
  std::vector<float> logits(20000);
  for (float& v : logits) v = static_cast<float>(level(rng)) * 0.25f;
  SamplerOptions o{2.0f, 12, 1.0f, 0.0f, 1.0f, 0};
  o.seed = rng();
  const auto want = Reference(logits, o, {});
  ASSERT_GT(want.size(), 12u) << "the case needs ties at the k-th logit";
  Sampler s(o);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[*s.Sample(logits)];
  for (const auto& [id, c] : counts) ASSERT_TRUE(want.count(id)) << "drew excluded token " << id;
  for (const auto& [id, p] : want) {
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(static_cast<double>(counts[id]) / n, p, 5 * sd + 1e-3) << "token " << id;
  }
}

TEST(Sampler, GreedyAppliesTheRepetitionPenaltyAndSameSeedRepeats) {
  std::vector<float> l = {1.0f, 3.0f, 2.9f, -1.0f};
  Sampler greedy(SamplerOptions{});
  EXPECT_EQ(*greedy.Sample(l), 1);
  SamplerOptions pen;
  pen.repetition_penalty = 1.5f;
  Sampler penalised(pen);
  const std::vector<int32_t> ctx = {1};
  EXPECT_EQ(*penalised.Sample(l, ctx), 2);  // 3.0 / 1.5 = 2.0 < 2.9

  SamplerOptions o;
  o.temperature = 1.0f;
  o.seed = 42;
  Sampler a(o), b(o);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(*a.Sample(l), *b.Sample(l));
}

// A NaN or an infinity among the logits is an error naming the token, whatever the filters
// (top-k with min-p once crashed on them, top-k alone read out of bounds).
TEST(Sampler, NonFiniteLogitsAreAnError) {
  const float kBad[] = {std::nanf(""), INFINITY, -INFINITY};
  for (float bad : kBad) {
    std::vector<float> l = {1.0f, 3.0f, 2.9f, -1.0f, 0.5f};
    l[3] = bad;
    for (SamplerOptions o : {SamplerOptions{}, SamplerOptions{1.0f, 2, 1.0f, 0.1f, 1.0f, 7},
                             SamplerOptions{0.8f, 3, 1.0f, 0.0f, 1.0f, 7},
                             SamplerOptions{1.0f, 0, 0.9f, 0.0f, 1.2f, 7}}) {
      Sampler s(o);
      const auto r = s.Sample(l, std::vector<int32_t>{0, 3});
      ASSERT_FALSE(r.ok()) << bad;
      EXPECT_NE(r.message().find("logit of token 3"), std::string::npos) << r.message();
    }
  }
  Sampler s(SamplerOptions{});
  EXPECT_FALSE(s.Sample(std::vector<float>{}).ok());
}

// Temperatures so small that 1 / T overflows float still sample the most likely token (and
// never the last id, which NaN probabilities used to give).
TEST(Sampler, TinyTemperatureIsGreedy) {
  const std::vector<float> l = {1.0f, 3.0f, 2.9f, -1.0f};
  for (float t : {1e-40f, 1e-30f, 1e-10f}) {
    SamplerOptions o;
    o.temperature = t;
    o.seed = 5;
    Sampler s(o);
    for (int i = 0; i < 50; ++i) ASSERT_EQ(*s.Sample(l), 1) << t;
  }
}

// OpenAI's presence and frequency penalties count the generated ids only (after n_prompt):
// logit -= presence if generated at all, -= frequency * times generated.
TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedIds) {
  const std::vector<float> l = {2.0f, 1.5f, 1.2f, 0.0f};
  // Prompt {0, 0}, then 0 generated twice and 1 once.
  const std::vector<int32_t> ctx = {0, 0, 0, 0, 1};
  const size_t n_prompt = 2;
  SamplerOptions freq;
  freq.frequency_penalty = 0.3f;  // 0: 2.0 - 0.6 = 1.4; 1: 1.5 - 0.3 = 1.2; 2: 1.2
  EXPECT_EQ(*Sampler(freq).Sample(l, ctx, n_prompt), 0);
  freq.frequency_penalty = 0.45f;  // 0: 1.1; 1: 1.05; 2: 1.2
  EXPECT_EQ(*Sampler(freq).Sample(l, ctx, n_prompt), 2);
  // The prompt's ids are not counted: the same ids as prompt leave the logits alone.
  EXPECT_EQ(*Sampler(freq).Sample(l, ctx, ctx.size()), 0);

  SamplerOptions presence;
  presence.presence_penalty = 0.9f;  // once per generated id: 0: 1.1; 1: 0.6; 2: 1.2
  EXPECT_EQ(*Sampler(presence).Sample(l, ctx, n_prompt), 2);
  presence.presence_penalty = 0.7f;  // 0: 1.3
  EXPECT_EQ(*Sampler(presence).Sample(l, ctx, n_prompt), 0);
  // A negative penalty encourages repeats.
  presence.presence_penalty = -1.0f;  // 2: 1.2 + 1 = 2.2 > 2.0
  EXPECT_EQ(*Sampler(presence).Sample(l, std::vector<int32_t>{2}, 0), 2);
}

// Sampling with the penalties follows the reference distribution over penalised logits.
TEST(Sampler, PenaltiesShiftTheDistributionAsTheirDefinition) {
  const std::vector<float> l = {0.5f, 0.4f, 0.3f};
  const std::vector<int32_t> ctx = {2, 0, 0, 1};  // prompt {2}; generated 0 twice, 1 once
  SamplerOptions o;
  o.temperature = 1.0f;
  o.seed = 11;
  o.presence_penalty = 0.25f;
  o.frequency_penalty = 0.5f;
  // Penalised: 0: 0.5 - 0.25 - 1.0 = -0.75; 1: 0.4 - 0.25 - 0.5 = -0.35; 2: 0.3.
  const std::vector<float> penalised = {-0.75f, -0.35f, 0.3f};
  SamplerOptions plain = o;
  plain.presence_penalty = plain.frequency_penalty = 0.0f;
  const auto want = Reference(penalised, plain, {});
  Sampler s(o);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[*s.Sample(l, ctx, 1)];
  for (const auto& [id, p] : want) EXPECT_NEAR(counts[id] / static_cast<double>(n), p, 0.02) << id;
}

TEST(Sampler, OptionRangesAreCheckedAndNamed) {
  SamplerOptions o;
  o.top_p = 0.0f;
  EXPECT_NE(ValidateSamplerOptions(o).message().find("--top-p"), std::string::npos);
  o = {};
  o.min_p = 2.0f;
  EXPECT_NE(ValidateSamplerOptions(o).message().find("--min-p"), std::string::npos);
  o = {};
  o.temperature = -1.0f;
  EXPECT_FALSE(ValidateSamplerOptions(o).ok());
  o = {};
  o.temperature = INFINITY;
  EXPECT_NE(ValidateSamplerOptions(o).message().find("--temperature"), std::string::npos);
  o = {};
  o.repetition_penalty = std::nanf("");
  EXPECT_NE(ValidateSamplerOptions(o).message().find("--repetition-penalty"), std::string::npos);
  o = {};
  o.presence_penalty = 2.5f;
  EXPECT_NE(ValidateSamplerOptions(o).message().find("--presence-penalty"), std::string::npos);
  o = {};
  o.frequency_penalty = std::nanf("");
  EXPECT_NE(ValidateSamplerOptions(o).message().find("--frequency-penalty"), std::string::npos);
  o = {};
  o.presence_penalty = -2.0f;
  o.frequency_penalty = 2.0f;
  EXPECT_TRUE(ValidateSamplerOptions(o).ok());
}

// A logit bias is added to the logits before anything else: a draw with it is the draw, of the
// same seed, from the row the bias made, whatever else is on (greedy, top-k, top-p, the
// penalties, which see the biased logits); -100 bans a token, +100 forces it; a bias makes every
// draw read the row (never the arg-max, candidates, or a device draw).
TEST(Sampler, LogitBiasIsAddedBeforeEverythingElse) {
  std::mt19937 rng(777);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t vocab = 3000;
  std::vector<SamplerOptions> settings(5);
  settings[1].temperature = 0.8f;
  settings[2].temperature = 1.1f, settings[2].top_k = 30, settings[2].top_p = 0.9f;
  settings[3].temperature = 0.7f, settings[3].repetition_penalty = 1.3f;
  settings[4].presence_penalty = 0.5f, settings[4].frequency_penalty = 0.4f;  // greedy
  for (size_t o = 0; o < settings.size(); ++o) {
    SamplerOptions biased = settings[o];
    biased.seed = settings[o].seed = rng();
    for (int i = 0; i < 40; ++i)
      biased.logit_bias.push_back(
          {static_cast<int32_t>(rng() % vocab), std::uniform_real_distribution<float>(-5, 5)(rng)});
    std::sort(biased.logit_bias.begin(), biased.logit_bias.end(),
              [](const TokenBias& a, const TokenBias& b) { return a.id < b.id; });
    biased.logit_bias.erase(
        std::unique(biased.logit_bias.begin(), biased.logit_bias.end(),
                    [](const TokenBias& a, const TokenBias& b) { return a.id == b.id; }),
        biased.logit_bias.end());
    std::shuffle(biased.logit_bias.begin(), biased.logit_bias.end(), rng);
    ASSERT_TRUE(ValidateSamplerOptions(biased).ok());
    Sampler with(biased), plain(settings[o]);
    EXPECT_FALSE(with.DrawsArgMax());
    EXPECT_EQ(with.CandidatesRead(vocab), 0);
    EXPECT_FALSE(with.DrawsOnDevice(vocab));
    for (int draw = 0; draw < 10; ++draw) {
      std::vector<float> l(static_cast<size_t>(vocab));
      for (float& v : l) v = normal(rng);
      std::vector<int32_t> ctx;
      for (int i = 0; i < 30; ++i) ctx.push_back(biased.logit_bias[static_cast<size_t>(i)].id);
      std::vector<float> shifted = l;
      for (const TokenBias& b : biased.logit_bias) shifted[static_cast<size_t>(b.id)] += b.bias;
      EXPECT_EQ(*with.Sample(l, ctx, 10), *plain.Sample(shifted, ctx, 10))
          << "setting " << o << " draw " << draw;
    }
  }
  const std::vector<float> l = {3.0f, 1.0f, 0.5f, 2.9f};
  SamplerOptions ban;
  ban.logit_bias = {{0, -kMaxLogitBias}};
  EXPECT_EQ(*Sampler(ban).Sample(l), 3);
  SamplerOptions force;
  force.temperature = 1.0f;
  force.logit_bias = {{2, kMaxLogitBias}};
  Sampler forced(force);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(*forced.Sample(l), 2);
}

// The bias's range and ids: each in [-100, 100], each id once, within the vocabulary.
TEST(Sampler, LogitBiasRangesAreChecked) {
  SamplerOptions o;
  o.logit_bias = {{5, 100.5f}};
  EXPECT_NE(ValidateSamplerOptions(o).message().find("logit_bias"), std::string::npos);
  o.logit_bias = {{5, std::nanf("")}};
  EXPECT_FALSE(ValidateSamplerOptions(o).ok());
  o.logit_bias = {{5, 1.0f}, {7, -100.0f}, {5, 2.0f}};
  EXPECT_NE(ValidateSamplerOptions(o).message().find("twice"), std::string::npos);
  o.logit_bias = {{5, 1.0f}, {7, -100.0f}};
  EXPECT_TRUE(ValidateSamplerOptions(o).ok());
  EXPECT_TRUE(ValidateLogitBias(o, 8).ok());
  const std::string outside = ValidateLogitBias(o, 7).message();
  EXPECT_NE(outside.find("token 7"), std::string::npos) << outside;
  EXPECT_NE(outside.find("[0, 7)"), std::string::npos) << outside;
}

// A draw from a row's top-k candidates (what a GPU hands back: kernels::TopKCandidates with
// kMaxCandidateTopK) is the draw from the whole row, draw after draw of the same seed, for the
// settings that read at most that many logits; with ties among the values too.
TEST(Sampler, CandidatesDrawWhatTheRowDraws) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<SamplerOptions> settings(6);
  settings[0].temperature = 0.7f, settings[0].top_k = 20;
  settings[1].temperature = 1.0f, settings[1].top_k = 40, settings[1].top_p = 0.9f;
  settings[2].temperature = 0.6f, settings[2].top_k = 20, settings[2].top_p = 0.95f,
  settings[2].min_p = 0.05f;
  settings[3].top_k = 20;  // greedy
  settings[4].temperature = 1.5f, settings[4].top_k = 1;
  settings[5].temperature = 3.0f, settings[5].top_k = kMaxCandidateTopK, settings[5].top_p = 0.5f;
  std::vector<LogitCandidate> cands(kMaxLogitCandidates);
  for (const int64_t vocab : {int64_t{100}, int64_t{5000}, int64_t{151936}}) {
    for (const bool ties : {false, true}) {
      for (size_t o = 0; o < settings.size(); ++o) {
        SamplerOptions opts = settings[o];
        opts.seed = rng();
        Sampler row_sampler(opts), cand_sampler(opts);
        ASSERT_EQ(cand_sampler.CandidatesRead(vocab), opts.temperature > 0.0f ? opts.top_k : 1);
        for (int draw = 0; draw < (vocab > 10000 ? 4 : 20); ++draw) {
          std::vector<float> l(static_cast<size_t>(vocab));
          // With ties: values on a grid of 1/16, so the k-th's value repeats a few times.
          for (float& v : l) v = ties ? std::round(normal(rng) * 16.0f) / 16.0f : normal(rng);
          const int32_t n = kernels::TopKCandidates(l.data(), vocab, kMaxCandidateTopK,
                                                    kMaxLogitCandidates, cands.data());
          ASSERT_GT(n, 0);
          auto want = row_sampler.Sample(l);
          ASSERT_TRUE(want.ok()) << want.message();
          EXPECT_EQ(cand_sampler.SampleCandidates({cands.data(), static_cast<size_t>(n)}), *want)
              << "vocab " << vocab << " ties " << ties << " setting " << o << " draw " << draw;
        }
      }
    }
  }
}

// Settings that may read past the largest kMaxCandidateTopK logits read the row.
TEST(Sampler, CandidatesReadIsZeroWhereADrawMayReadTheRow) {
  SamplerOptions o;
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 1);  // greedy
  o.temperature = 1.0f;
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 0);  // no top-k
  o.top_k = kMaxCandidateTopK + 1;
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 0);
  o.top_k = 50;
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 50);
  EXPECT_EQ(Sampler(o).CandidatesRead(50), 0);  // the whole vocabulary
  o.repetition_penalty = 1.1f;
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 0);
  o.repetition_penalty = 1.0f;
  o.presence_penalty = 0.5f;
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 0);
  o.temperature = 0.0f;  // greedy with a penalty reads the row
  EXPECT_EQ(Sampler(o).CandidatesRead(1000), 0);
}

// Which settings a GPU may draw itself: a temperature, with top-p or min-p, over the whole
// vocabulary, no penalty.
TEST(Sampler, DrawsOnDeviceOnlyWithoutTopKAndPenalties) {
  SamplerOptions o;
  EXPECT_FALSE(Sampler(o).DrawsOnDevice(1000));  // greedy
  o.temperature = 0.7f;
  EXPECT_TRUE(Sampler(o).DrawsOnDevice(1000));
  o.top_p = 0.9f;
  o.min_p = 0.05f;
  EXPECT_TRUE(Sampler(o).DrawsOnDevice(1000));
  EXPECT_FALSE(Sampler(o).DrawsOnDevice(kMaxDrawVocab + 1));
  o.top_k = 20;
  EXPECT_FALSE(Sampler(o).DrawsOnDevice(1000));
  EXPECT_TRUE(Sampler(o).DrawsOnDevice(20));  // top-k of the whole vocabulary
  o.top_k = 0;
  o.frequency_penalty = 0.5f;
  EXPECT_FALSE(Sampler(o).DrawsOnDevice(1000));
  o.frequency_penalty = 0.0f;
  o.repetition_penalty = 1.1f;
  EXPECT_FALSE(Sampler(o).DrawsOnDevice(1000));
}

// A device draw's uniform stays the next one until committed (a step run again draws with the
// same), and takes one draw's random bits, as a host draw does: a seed's later draws follow.
TEST(Sampler, DeviceDrawKeepsItsUniformUntilCommitted) {
  SamplerOptions o;
  o.temperature = 0.5f;
  o.top_p = 0.8f;
  o.min_p = 0.1f;
  o.seed = 1234;
  Sampler device(o), host(o);
  const RowDraw first = device.DeviceDraw();
  EXPECT_GE(first.u, 0.0);
  EXPECT_LT(first.u, 1.0);
  EXPECT_EQ(first.inv_temperature, 2.0f);
  EXPECT_EQ(first.top_p, 0.8f);
  EXPECT_EQ(first.min_p, 0.1f);
  EXPECT_EQ(device.DeviceDraw().u, first.u);
  device.CommitDeviceDraw();
  const RowDraw second = device.DeviceDraw();
  EXPECT_NE(second.u, first.u);
  device.CommitDeviceDraw();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(500);
  for (float& v : l) v = normal(rng);
  ASSERT_TRUE(host.Sample(l).ok());
  ASSERT_TRUE(host.Sample(l).ok());
  for (int i = 0; i < 5; ++i) {
    auto a = device.Sample(l), b = host.Sample(l);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << "draw " << i;
  }
  o.temperature = 1e-40f;  // its inverse overflows a float: infinity
  EXPECT_EQ(Sampler(o).DeviceDraw().inv_temperature, INFINITY);
}

// kernels::TopKCandidates: every finite value at least the k-th largest, in order, or -1 past
// the room given.
TEST(TopKCandidates, KeepsTiesSkipsNonFiniteAndRefusesPastItsRoom) {
  const float nan = std::nanf("");
  const std::vector<float> l = {1.0f, 3.0f, nan, 2.0f, 3.0f, INFINITY, 2.0f, 0.5f};
  std::vector<LogitCandidate> out(8);
  ASSERT_EQ(kernels::TopKCandidates(l.data(), 8, 3, 8, out.data()), 4);  // 3, 3, 2, 2
  const int32_t ids[] = {1, 4, 3, 6};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[static_cast<size_t>(i)].id, ids[i]) << i;
  EXPECT_EQ(out[2].logit, 2.0f);
  EXPECT_EQ(kernels::TopKCandidates(l.data(), 8, 3, 3, out.data()), -1);
  EXPECT_EQ(kernels::TopKCandidates(l.data(), 8, 50, 8, out.data()), 6);  // every finite one
  EXPECT_EQ(out[5].id, 7);
}

}  // namespace
}  // namespace moetier

namespace moetier {
namespace {}  // namespace
}  // namespace moetier
