#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace moetier {

namespace {

// One window's scored tokens: the sums of -log p and of its square, and how many.
struct WindowSums {
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  bool done = false;
  Status status;
};

PerplexityResult Combine(const std::vector<WindowSums>& windows) {
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  for (const WindowSums& w : windows) {
    if (!w.done) continue;
    nll += w.nll;
    nll2 += w.nll2;
    count += w.count;
  }
  PerplexityResult r;
  if (count == 0) return r;
  r.tokens_scored = count;
  r.mean_nll = nll / static_cast<double>(count);
  r.perplexity = std::exp(r.mean_nll);
  const double variance = nll2 / static_cast<double>(count) - r.mean_nll * r.mean_nll;
  if (count > 1 && variance > 0)
    r.plus_minus = std::sqrt(variance / static_cast<double>(count - 1)) * r.perplexity;
  return r;
}

// Window w's request: its tokens, the second half's log-probabilities, one token generated (the
// engine generates at least one; it is not scored).
RequestOptions WindowRequest(std::span<const int32_t> tokens, int64_t w,
                             const PerplexityOptions& o) {
  RequestOptions r;
  const auto start = tokens.begin() + w * o.ctx;
  r.prompt.assign(start, start + o.ctx);
  if (o.bos) r.prompt.front() = *o.bos;
  r.max_new_tokens = 1;
  r.top_logprobs = 0;
  r.prompt_logprobs = true;
  r.first_prompt_logprob = o.ctx / 2 + 1;
  return r;
}

}  // namespace

int64_t PerplexityWindows(int64_t n_tokens, const PerplexityOptions& o) {
  const int64_t whole = o.ctx > 0 ? n_tokens / o.ctx : 0;
  return o.max_windows >= 0 ? std::min(whole, o.max_windows) : whole;
}

Expected<PerplexityResult> MeasurePerplexity(Engine& engine, std::span<const int32_t> tokens,
                                             const PerplexityOptions& o,
                                             const PerplexityProgress& progress) {
  if (o.ctx < kMinPerplexityCtx)
    return Status::Error("--ctx: at least " + std::to_string(kMinPerplexityCtx) +
                         " tokens a window (half of it is scored)");
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  if (n_tokens < 2 * o.ctx)
    return Status::Error("the text has " + std::to_string(n_tokens) + " tokens; windows of --ctx " +
                         std::to_string(o.ctx) + " need at least " + std::to_string(2 * o.ctx) +
                         " (a longer text or a smaller --ctx)");
  const int64_t n_windows = PerplexityWindows(n_tokens, o);
  if (n_windows < 1) return Status::Error("--chunks: at least 1 window to measure");
  std::vector<WindowSums> sums(static_cast<size_t>(n_windows));
  int64_t done = 0;
  for (int64_t w = 0; w < n_windows; ++w) {
    engine.Submit(WindowRequest(tokens, w, o), [&, w](const RequestEvent& e) {
      WindowSums& s = sums[static_cast<size_t>(w)];
      if (e.kind == RequestEvent::Kind::kPromptLogprobs) {
        for (const TokenLogprobs& lp : e.prompt_logprobs) {
          const double v = -static_cast<double>(lp.chosen.logprob);
          s.nll += v;
          s.nll2 += v * v;
          ++s.count;
        }
      } else if (e.kind == RequestEvent::Kind::kFinished) {
        s.status = e.status;
        s.done = e.status.ok();
        ++done;
        if (progress && s.done) progress(done, n_windows, Combine(sums).perplexity);
      }
    });
  }
  engine.RunUntilIdle();
  for (int64_t w = 0; w < n_windows; ++w) {
    const WindowSums& s = sums[static_cast<size_t>(w)];
    if (!s.status.ok())
      return s.status.WithContext("window " + std::to_string(w + 1) + " of " +
                                  std::to_string(n_windows));
  }
  PerplexityResult r = Combine(sums);
  r.windows = n_windows;
  return r;
}

}  // namespace moetier
