// Milliseconds a draw of Sampler::Sample over a real vocabulary (151,936 tokens) of random
// logits (a standard normal, times 3: a peaked but not one-hot distribution), per setting, one
// JSON object a line: what sampling costs a sequence per decoded token on the host.
//
//   build/bench/engine/sampler_bench [vocab] [draws]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler.h"

int main(int argc, char** argv) {
  using namespace moetier;
  const size_t vocab = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 151936;
  const int draws = argc > 2 ? std::atoi(argv[2]) : 200;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(rng);
  struct Setting {
    std::string name;
    SamplerOptions o;
  };
  std::vector<Setting> settings(6);
  settings[0] = {"greedy", {}};
  settings[1].name = "temperature 0.7";
  settings[1].o.temperature = 0.7f;
  settings[2].name = "top-k 40";
  settings[2].o.temperature = 0.7f;
  settings[2].o.top_k = 40;
  settings[3].name = "top-p 0.95";
  settings[3].o.temperature = 0.7f;
  settings[3].o.top_p = 0.95f;
  settings[4].name = "min-p 0.05";
  settings[4].o.temperature = 0.7f;
  settings[4].o.min_p = 0.05f;
  settings[5].name = "repetition 1.1, top-p 0.9";
  settings[5].o.temperature = 1.0f;
  settings[5].o.top_p = 0.9f;
  settings[5].o.repetition_penalty = 1.1f;
  std::vector<int32_t> context(512);
  for (auto& id : context) id = static_cast<int32_t>(rng() % vocab);
  for (const Setting& s : settings) {
    Sampler sampler(s.o);
    SamplerScratch scratch;
    int64_t sum = 0;
    (void)sampler.Sample(logits, context, 256, scratch);  // sizes the scratch
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < draws; ++i) sum += *sampler.Sample(logits, context, 256, scratch);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "{\"setting\": \"%s\", \"vocab\": %zu, \"ms_per_draw\": %.4f, \"checksum\": %lld}\n",
        s.name.c_str(), vocab, ms / draws, static_cast<long long>(sum));
  }
  return 0;
}
