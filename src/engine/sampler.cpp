#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "kernels/cpu/elementwise.h"

namespace moetier {

namespace {
// The OpenAI API's range for presence and frequency penalties.
constexpr float kMaxOccurrencePenalty = 2.0f;
}  // namespace

Status ValidateSamplerOptions(const SamplerOptions& o) {
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    return Status::Error("--temperature must be a finite number >= 0 (0: greedy)");
  if (o.top_k < 0) return Status::Error("--top-k must be >= 0 (0 turns it off)");
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) return Status::Error("--top-p must be in (0, 1]");
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f)) return Status::Error("--min-p must be in [0, 1]");
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty))
    return Status::Error("--repetition-penalty must be > 0 (1 turns it off)");
  if (!(o.presence_penalty >= -kMaxOccurrencePenalty &&
        o.presence_penalty <= kMaxOccurrencePenalty))
    return Status::Error("--presence-penalty must be in [-2, 2] (0 turns it off)");
  if (!(o.frequency_penalty >= -kMaxOccurrencePenalty &&
        o.frequency_penalty <= kMaxOccurrencePenalty))
    return Status::Error("--frequency-penalty must be in [-2, 2] (0 turns it off)");
  std::vector<int32_t> ids;
  for (const TokenBias& b : o.logit_bias) {
    if (!(b.bias >= -kMaxLogitBias && b.bias <= kMaxLogitBias))
      return Status::Error("logit_bias: the bias of token " + std::to_string(b.id) +
                           " must be in [-100, 100]");
    ids.push_back(b.id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end())
    return Status::Error("logit_bias names token " + std::to_string(*twice) + " twice");
  return OkStatus();
}

std::optional<int32_t> LogitBiasTokenId(std::string_view key) {
  if (key.empty() || key.size() > 10) return std::nullopt;
  int64_t id = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + (c - '0');
  }
  if (id > std::numeric_limits<int32_t>::max()) return std::nullopt;
  return static_cast<int32_t>(id);
}

Status ValidateLogitBias(const SamplerOptions& o, int64_t vocab) {
  for (const TokenBias& b : o.logit_bias)
    if (b.id < 0 || b.id >= vocab)
      return Status::Error("logit_bias names token " + std::to_string(b.id) +
                           ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
  return OkStatus();
}

namespace {

// A candidate's weight, exp((logit - max) / T) in double: every weight lies in [0, 1] and the
// largest is exactly 1, so no temperature, however small (1e-40 overflows 1 / T in float), makes
// them inf or NaN; a tiny one only sends the others to 0, which is greedy.
double Weight(float logit, float max, double inv_t) {
  return std::exp((static_cast<double>(logit) - max) * inv_t);
}

// Weights are bucketed by -ln(weight), kBucketsPerUnit to a unit, to find how far down the
// order top-p can reach without sorting the vocabulary; past kLastUnit a double's exp is 0.
constexpr double kBucketsPerUnit = 4.0;
constexpr double kLastUnit = 746.0;
constexpr size_t kBuckets = static_cast<size_t>(kLastUnit * kBucketsPerUnit) + 1;
size_t BucketOf(float logit, float max, double inv_t) {
  const double units = (static_cast<double>(max) - logit) * inv_t;
  return units < kLastUnit ? static_cast<size_t>(units * kBucketsPerUnit) : kBuckets - 1;
}
// The bucket sums are in another order than the sorted candidates' running sum; a cut this much
// past top-p holds the prefix that running sum reaches whatever the rounding.
constexpr double kTopPMargin = 1e-9;
constexpr size_t kMassCopies = 4;  // interleaved bucket histograms (Candidates says why)

// A float no larger than any logit of bucket b or below: those lie less than (b + 1) / 4 units
// below max, units of (max - logit) / T; two steps down absorb the rounding of that bound and
// of BucketOf's own arithmetic.
float LowestLogitIn(size_t b, float max, double inv_t) {
  const auto bound = static_cast<float>(static_cast<double>(max) -
                                        (static_cast<double>(b) + 1) / kBucketsPerUnit / inv_t);
  const float down = -std::numeric_limits<float>::infinity();
  return std::nextafter(std::nextafter(bound, down), down);
}

}  // namespace

void Sampler::ApplyOccurrencePenalties(std::span<const int32_t> generated, SamplerScratch& x) {
  x.sorted.assign(generated.begin(), generated.end());
  std::sort(x.sorted.begin(), x.sorted.end());
  for (size_t i = 0; i < x.sorted.size();) {
    size_t j = i;
    while (j < x.sorted.size() && x.sorted[j] == x.sorted[i]) ++j;
    const int32_t id = x.sorted[i];
    if (id >= 0 && static_cast<size_t>(id) < x.work.size()) {
      x.work[static_cast<size_t>(id)] -=
          options_.presence_penalty + options_.frequency_penalty * static_cast<float>(j - i);
    }
    i = j;
  }
}

Sampler::Sampler(const SamplerOptions& options)
    : options_(options), rng_(options.seed), bias_(options.logit_bias) {
  std::sort(bias_.begin(), bias_.end(),
            [](const TokenBias& a, const TokenBias& b) { return a.id < b.id; });
}

bool Sampler::ChangesLogits() const {
  return options_.repetition_penalty != 1.0f || options_.presence_penalty != 0.0f ||
         options_.frequency_penalty != 0.0f || !bias_.empty();
}

float Sampler::BiasOf(int32_t id) const {
  auto it = std::lower_bound(bias_.begin(), bias_.end(), id,
                             [](const TokenBias& b, int32_t v) { return b.id < v; });
  return it != bias_.end() && it->id == id ? it->bias : 0.0f;
}

bool Sampler::DrawsArgMax() const {
  return options_.temperature <= 0.0f && !ChangesLogits();
}

Expected<int32_t> Sampler::Sample(std::span<const float> logits, std::span<const int32_t> context,
                                  size_t n_prompt) {
  return Sample(logits, context, n_prompt, own_);
}

Expected<int32_t> Sampler::Sample(std::span<const float> logits, std::span<const int32_t> context,
                                  size_t n_prompt, SamplerScratch& x) {
  if (logits.empty()) return Status::Error("no logits to sample from (an empty vocabulary)");
  if (const int64_t bad =
          kernels::FirstNonFinite(logits.data(), static_cast<int64_t>(logits.size()));
      bad >= 0)
    return Status::Error("the logit of token " + std::to_string(bad) + " is " +
                         std::to_string(logits[static_cast<size_t>(bad)]) +
                         ": the model computed a non-finite value; its weights or config are "
                         "broken");
  std::span<const float> l = logits;
  const std::span<const int32_t> generated = context.subspan(std::min(n_prompt, context.size()));
  const bool repetition = options_.repetition_penalty != 1.0f && !context.empty();
  const bool occurrence =
      (options_.presence_penalty != 0.0f || options_.frequency_penalty != 0.0f) &&
      !generated.empty();
  if (!bias_.empty() || repetition || occurrence) {
    x.work.assign(logits.begin(), logits.end());
    l = x.work;
  }
  for (const TokenBias& b : bias_)
    if (b.id >= 0 && static_cast<size_t>(b.id) < x.work.size())
      x.work[static_cast<size_t>(b.id)] += b.bias;
  if (repetition) {
    const float p = options_.repetition_penalty;
    for (int32_t id : context) {
      if (id < 0 || static_cast<size_t>(id) >= x.work.size()) continue;
      // Penalise each id once, however often it occurs (as Hugging Face's gather/scatter does):
      // the logit before any penalty decides the direction.
      const float orig = logits[static_cast<size_t>(id)] + BiasOf(id);
      x.work[static_cast<size_t>(id)] = orig < 0 ? orig * p : orig / p;
    }
  }
  if (occurrence) ApplyOccurrencePenalties(generated, x);
  if (options_.temperature <= 0.0f)
    return static_cast<int32_t>(kernels::ArgMax(l.data(), static_cast<int64_t>(l.size())));

  const double inv_t = 1.0 / static_cast<double>(options_.temperature);
  const bool every_token = options_.top_k <= 0 || static_cast<size_t>(options_.top_k) >= l.size();
  if (every_token && options_.top_p >= 1.0f && options_.min_p <= 0.0f)
    return DrawInTokenOrder(l, inv_t, x);
  return Draw(Candidates(l, inv_t, x), x);
}

int32_t Sampler::CandidatesRead(int64_t vocab) const {
  if (DrawsArgMax()) return 1;
  if (ChangesLogits() || options_.top_k <= 0 || options_.top_k > kMaxCandidateTopK ||
      options_.top_k >= vocab)
    return 0;
  return options_.top_k;
}

bool Sampler::DrawsOnDevice(int64_t vocab) const {
  return options_.temperature > 0.0f && !ChangesLogits() &&
         (options_.top_k <= 0 || options_.top_k >= vocab) && vocab <= kMaxDrawVocab;
}

RowDraw Sampler::DeviceDraw() {
  if (!pending_u_) pending_u_ = NextUniform();
  RowDraw d;
  d.u = *pending_u_;
  // A temperature so small that its inverse overflows gives infinity: only the largest logits
  // weigh (draw.h).
  d.inv_temperature = static_cast<float>(1.0 / static_cast<double>(options_.temperature));
  d.top_p = options_.top_p;
  d.min_p = options_.min_p;
  return d;
}

int32_t Sampler::SampleCandidates(std::span<const LogitCandidate> cands, SamplerScratch& x) {
  if (options_.temperature <= 0.0f) return cands[0].id;
  const double inv_t = 1.0 / static_cast<double>(options_.temperature);
  const size_t k = std::min(static_cast<size_t>(options_.top_k), cands.size());
  const float kth = cands[k - 1].logit;  // the k-th largest, counting equal values apart
  x.cand.clear();
  for (const LogitCandidate& c : cands) {
    if (c.logit < kth) break;
    x.cand.emplace_back(c.logit, c.id);
  }
  return Draw(WeighCandidates(cands[0].logit, inv_t, x), x);
}

double Sampler::WeighCandidates(float max, double inv_t, SamplerScratch& x) const {
  x.probs.resize(x.cand.size());
  double total = 0.0;
  for (size_t i = 0; i < x.cand.size(); ++i)
    total += x.probs[i] = Weight(x.cand[i].first, max, inv_t);
  return total;
}

int32_t Sampler::Draw(double total, SamplerScratch& x) {
  size_t n = x.cand.size();
  if (options_.top_p < 1.0f) {
    // The smallest prefix whose probability reaches top_p (at least one token).
    double acc = 0.0;
    size_t keep = 0;
    while (keep < n) {
      acc += x.probs[keep] / total;
      ++keep;
      if (acc >= options_.top_p) break;
    }
    n = keep;
  }
  if (options_.min_p > 0.0f) {  // the first candidate is the most likely, of weight 1
    const double floor = options_.min_p * x.probs[0];
    size_t keep = 1;
    while (keep < n && x.probs[keep] >= floor) ++keep;
    n = keep;
  }
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += x.probs[i];
  // u in [0, sum) from 53 random bits: the mapping from seed to token is fixed by this code,
  // not by a library's distribution implementation.
  const double u = NextUniform() * sum;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += x.probs[i];
    if (u < acc) return x.cand[i].second;
  }
  return x.cand[n - 1].second;
}

double Sampler::Candidates(std::span<const float> l, double inv_t, SamplerScratch& x) {
  // Candidates ordered by logit, which is their order by logit / temperature too: the
  // temperature enters only the weights.
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  const float max = kernels::MaxOf(l.data(), static_cast<int64_t>(l.size()));
  x.cand.clear();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < l.size()) {
    const float kth = KthLargest(l, static_cast<size_t>(options_.top_k), x);
    // Keep ties with the k-th logit, as Hugging Face's threshold does.
    kernels::ForChunksAtLeast(l, 0, kth, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i)
        if (l[i] >= kth) x.cand.emplace_back(l[i], static_cast<int32_t>(i));
    });
    std::sort(x.cand.begin(), x.cand.end(), by_logit);
    return WeighCandidates(max, inv_t, x);
  }
  // Every token may be drawn. Only top-p needs an order, and only down to where it stops; min-p
  // drops the tokens under its floor (min_p times the largest weight, 1) at once.
  const auto min_weight = static_cast<double>(options_.min_p);
  TokenWeights(l, max, inv_t, x);
  double total = 0.0;
  size_t last_bucket = kBuckets - 1;
  float floor_logit = -std::numeric_limits<float>::infinity();  // below it, past last_bucket
  if (options_.top_p < 1.0f) {
    // kMassCopies histograms, token i adding to copy i % kMassCopies: consecutive tokens of one
    // bucket (most of them, in a flat distribution) do not wait on each other's stores. Their
    // order of sums only moves the cut within kTopPMargin; the total keeps its token order.
    x.bucket_mass.assign(kMassCopies * kBuckets, 0.0);
    for (size_t i = 0; i < l.size(); ++i) {
      const double w = x.weights[i];
      total += w;
      x.bucket_mass[(i % kMassCopies) * kBuckets + BucketOf(l[i], max, inv_t)] += w;
    }
    const double reach = options_.top_p * total * (1 + kTopPMargin);
    double acc = 0.0;
    for (size_t b = 0; b < kBuckets; ++b) {
      for (size_t c = 0; c < kMassCopies; ++c) acc += x.bucket_mass[c * kBuckets + b];
      if (acc >= reach) {
        last_bucket = b;
        break;
      }
    }
    if (last_bucket < kBuckets - 1) floor_logit = LowestLogitIn(last_bucket, max, inv_t);
  }
  // Chunks wholly below the last bucket's floor are skipped after one vectorized test.
  kernels::ForChunksAtLeast(l, 0, floor_logit, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (options_.top_p < 1.0f && BucketOf(l[i], max, inv_t) > last_bucket) continue;
      if (min_weight > 0.0 && x.weights[i] < min_weight) continue;
      x.cand.emplace_back(l[i], static_cast<int32_t>(i));
    }
  });
  // The most likely first: min-p's floor and top-p's prefix read the order; a plain draw does
  // not, and skips the sort.
  if (options_.top_p < 1.0f || min_weight > 0.0) std::sort(x.cand.begin(), x.cand.end(), by_logit);
  x.probs.resize(x.cand.size());
  double kept = 0.0;
  for (size_t i = 0; i < x.cand.size(); ++i)
    kept += x.probs[i] = x.weights[static_cast<size_t>(x.cand[i].second)];
  return options_.top_p < 1.0f ? total : kept;
}

float Sampler::KthLargest(std::span<const float> l, size_t k, SamplerScratch& x) {
  // The k largest so far in a min-heap: one comparison with its top for most logits.
  auto& heap = x.largest;
  heap.assign(l.begin(), l.begin() + static_cast<std::ptrdiff_t>(k));
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  // Chunks with nothing above the heap's top (most, once it holds large values) are skipped
  // after one vectorized test; a chunk holding one is walked element by element, its top
  // re-read as it rises.
  kernels::ForChunksAtLeast(l, k, heap.front(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      if (l[i] <= heap.front()) continue;
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = l[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  });
  return heap.front();
}

void Sampler::TokenWeights(std::span<const float> l, float max, double inv_t,
                           SamplerScratch& x) const {
  x.weights.resize(l.size());
  kernels::ScaledExp(l.data(), static_cast<int64_t>(l.size()), max, inv_t, x.weights.data());
}

int32_t Sampler::DrawInTokenOrder(std::span<const float> l, double inv_t, SamplerScratch& x) {
  const auto n = static_cast<int64_t>(l.size());
  TokenWeights(l, kernels::MaxOf(l.data(), n), inv_t, x);
  // The weights' sums by chunk (vectorized within one), then the draw walks the chunks and
  // scans the one it falls in: the same token as one running sum, but for rounding.
  constexpr int64_t kChunk = 256;
  x.chunk_mass.resize(static_cast<size_t>((n + kChunk - 1) / kChunk));
  double total = 0.0;
  for (size_t c = 0; c < x.chunk_mass.size(); ++c) {
    const int64_t begin = static_cast<int64_t>(c) * kChunk;
    total += x.chunk_mass[c] =
        kernels::SumOf(x.weights.data() + begin, std::min(kChunk, n - begin));
  }
  const double u = NextUniform() * total;
  double acc = 0.0;
  size_t c = 0;
  while (c + 1 < x.chunk_mass.size() && acc + x.chunk_mass[c] <= u) acc += x.chunk_mass[c++];
  int64_t last = -1;  // the last token with weight, should rounding leave u past the chunk's sum
  for (int64_t i = static_cast<int64_t>(c) * kChunk;
       i < std::min(n, static_cast<int64_t>(c + 1) * kChunk); ++i) {
    if (x.weights[static_cast<size_t>(i)] <= 0.0f) continue;
    acc += x.weights[static_cast<size_t>(i)];
    last = i;
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last >= 0 ? last : kernels::ArgMax(l.data(), n));
}

}  // namespace moetier
