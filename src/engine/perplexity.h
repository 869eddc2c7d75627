// A model's perplexity over a text, measured as llama.cpp's llama-perplexity measures it, so that
// the two compare on the same weights: the text's tokens (with the special tokens the tokenizer
// adds to any text) are cut into windows of `ctx` tokens, the first of each replaced by the BOS
// token when the tokenizer puts one before text; each window runs from an empty cache, and the
// second half of each is scored: -log p(token j | the window's tokens before it) for j from ctx/2 +
// 1 to ctx - 1. The perplexity is exp(the mean), ± the mean's standard error carried through exp.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "core/status.h"
#include "engine/engine.h"

namespace moetier {

struct PerplexityOptions {
  int64_t ctx = 512;           // tokens a window (at least kMinPerplexityCtx)
  int64_t max_windows = -1;    // -1: every whole window the text holds
  std::optional<int32_t> bos;  // the first token of every window, when the tokenizer adds one
};

// The smallest window: one token scored needs ctx - 1 - ctx / 2 >= 1.
constexpr int64_t kMinPerplexityCtx = 4;

struct PerplexityResult {
  double perplexity = 0;
  double plus_minus = 0;  // the standard error of the mean, carried through exp
  double mean_nll = 0;
  int64_t tokens_scored = 0;
  int64_t windows = 0;
};

// The windows measured over `n_tokens` tokens (whole windows only, at most max_windows).
int64_t PerplexityWindows(int64_t n_tokens, const PerplexityOptions& o);

// After each window: how many are done, of how many, and the perplexity over those done.
using PerplexityProgress = std::function<void(int64_t done, int64_t total, double running)>;

// Runs every window through `engine` (as many at once as it runs) and sums them in window
// order, so the result does not depend on which finished first. Errors: too few tokens for two
// windows (llama.cpp's minimum), a window the engine refused.
Expected<PerplexityResult> MeasurePerplexity(Engine& engine, std::span<const int32_t> tokens,
                                             const PerplexityOptions& o,
                                             const PerplexityProgress& progress = nullptr);

}  // namespace moetier
