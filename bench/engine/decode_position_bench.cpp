// Decode-step cost against position: a step at position ~500 must cost what one at ~5 does,
// apart from attention over the longer cache (the KV cache grows by doubling, nothing else
// depends on position). Prints one JSON object.
//
//   decode_position_bench --model DIR [--threads N] [--steps 32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/causal_lm.h"

using namespace moetier;

namespace {

double MedianStepMs(CausalLM& model, KvCache& cache, int steps) {
  std::vector<double> ms;
  std::vector<float> logits;
  int32_t token = 1;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t one[1] = {token};
    if (!model.Forward(one, cache, LogitsFor::kLastToken, logits).ok()) std::exit(1);
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int threads = 0, steps = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model"))
      dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: decode_position_bench --model DIR [--threads N] [--steps S]\n");
    return 2;
  }
  LoadOptions options;
  options.n_threads = threads;
  auto model = LoadCausalLM(dir, options);
  if (!model.ok()) {
    std::fprintf(stderr, "error: %s\n", model.message().c_str());
    return 1;
  }
  KvCache cache = *(*model)->NewCache(1024);
  std::vector<int32_t> prompt(4, 1);
  std::vector<float> logits;
  if (!(*model)->Forward(prompt, cache, LogitsFor::kLastToken, logits).ok()) return 1;
  const double early = MedianStepMs(**model, cache, steps);  // positions 4 .. 4+steps
  std::vector<int32_t> fill(static_cast<size_t>(500 - cache.n_past()), 1);
  if (!(*model)->Forward(fill, cache, LogitsFor::kLastToken, logits).ok()) return 1;
  const double late = MedianStepMs(**model, cache, steps);  // positions 500 .. 500+steps
  std::printf(
      "{\"model\": \"%s\", \"threads\": %d, \"step_ms_at_pos_5\": %.3f, \"step_ms_at_pos_500\": "
      "%.3f, \"ratio\": %.3f}\n",
      dir.c_str(), threads > 0 ? threads : ThreadPool::AvailableThreads(), early, late,
      late / early);
  return 0;
}
