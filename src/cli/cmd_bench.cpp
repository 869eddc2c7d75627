// moetier bench: prefill and decode speed, against the machine's read bandwidth measured in the
// same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "core/log.h"
#include "engine/bandwidth.h"
#include "engine/sampler.h"
#include "experts/memory_limits.h"
#include "kernels/cpu/cpu_isa.h"

namespace moetier::cli {

namespace {

struct Opts {
  ModelOptions model;
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 32;
  int repeats = 3;
  bool json = false;
  bool profile = false;
  double bandwidth_mib = static_cast<double>(kBandwidthBufferBytes >> 20);
};

// The most of the available RAM the bandwidth buffer may take.
constexpr double kBandwidthRamShare = 0.5;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The formats the MoE layers' experts are held in, "BF16C" or, when layers differ (a layer
// that did not pack, banks pinned for the GPU), "BF16C+BF16" in layer order.
std::string HeldDTypes(const CausalLM& lm) {
  const auto& settled = lm.residency().settled;
  return settled && !settled->empty() ? moetier::HeldDTypes(*settled)
                                      : std::string(DTypeName(lm.expert_dtype()));
}

// The bandwidth buffer must be far past the caches (so the figure is DRAM's) and fit the RAM
// available now (or the pages it touches would be swapped, or the process killed).
Status CheckBandwidthBuffer(double mib) {
  const double available_mib = static_cast<double>(ReadHostMemoryInfo().available_bytes >> 20);
  if (mib > available_mib * kBandwidthRamShare)
    return Status::Error("--bandwidth-mib " + std::to_string(static_cast<int64_t>(mib)) +
                         ": more than half of the " +
                         std::to_string(static_cast<int64_t>(available_mib)) +
                         " MiB of RAM available now; give at most " +
                         std::to_string(static_cast<int64_t>(available_mib * kBandwidthRamShare)));
  return OkStatus();
}

int Run(const Opts& o) {
  if (Status s = CheckBandwidthBuffer(o.bandwidth_mib); !s.ok()) return ReportError(s.message());
  auto loaded = LoadModel(o.model);
  if (!loaded.ok()) return ReportError(loaded.message());
  CausalLM& lm = **loaded;
  const int threads = o.model.n_threads > 0 ? o.model.n_threads : ThreadPool::DefaultThreads();
  const int64_t ctx = o.prompt_tokens + o.gen_tokens + 1;

  // Prompt tokens drawn from the vocabulary with a fixed seed: the same work every run.
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt_tokens));
  for (auto& t : prompt)
    t = static_cast<int32_t>(rng() % static_cast<uint32_t>(lm.config().vocab_size));

  std::vector<double> prefill_tps, decode_tps;
  PhaseTimes decode_times;   // summed over every run's decode steps (--profile)
  PhaseTimes prefill_times;  // summed over every run's prompt (--profile)
  std::vector<float> logits;
  for (int r = 0; r < o.repeats; ++r) {
    std::fprintf(stderr, "bench: run %d/%d: prefill %lld tokens, decode %lld tokens\n", r + 1,
                 o.repeats, static_cast<long long>(o.prompt_tokens),
                 static_cast<long long>(o.gen_tokens));
    auto made = lm.NewCache(ctx);
    if (!made.ok()) return ReportError(made.message());
    KvCache cache = std::move(made).value();
    if (o.profile) lm.SetPhaseTimes(&prefill_times);
    auto t0 = std::chrono::steady_clock::now();
    Status s = lm.Forward(prompt, cache, LogitsFor::kLastToken, logits);
    if (!s.ok()) return ReportError(s.message());
    prefill_tps.push_back(static_cast<double>(o.prompt_tokens) / Seconds(t0));
    lm.SetPhaseTimes(nullptr);
    int32_t next = ArgMax(logits);
    if (o.profile) lm.SetPhaseTimes(&decode_times);
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.gen_tokens; ++i) {
      const int32_t one[1] = {next};
      s = lm.Forward(one, cache, LogitsFor::kLastToken, logits);
      if (!s.ok()) return ReportError(s.message());
      next = ArgMax(logits);
    }
    decode_tps.push_back(static_cast<double>(o.gen_tokens) / Seconds(t0));
    lm.SetPhaseTimes(nullptr);
  }
  std::fprintf(stderr, "bench: measuring read bandwidth with %d threads\n", threads);
  ThreadPool pool(threads);
  const auto measured =
      MeasureReadBandwidthGbps(pool, static_cast<size_t>(o.bandwidth_mib * double(1 << 20)));
  if (!measured.ok()) return ReportError(measured.message() + " (--bandwidth-mib)");
  const double bw = *measured;

  const double prefill = Median(prefill_tps), decode = Median(decode_tps);
  const uint64_t bytes = lm.DecodeBytesPerToken();
  const double gbps = decode * static_cast<double>(bytes) / 1e9;
  nlohmann::ordered_json j;
  j["model"] = o.model.model_dir;
  // The experts' dtype as stored (the model's), and as held for the kernels: --weight-packing
  // may hold bf16 as bf16c (the same values; decode_bytes_per_token counts the held bytes).
  j["dtype"] = std::string(DTypeName(lm.residency().stored_dtype));
  j["held_dtype"] = HeldDTypes(lm);
  // Where the dense matrices stream from: "copy" (anonymous memory), "mapped" (the model file's
  // mapping) or "" (another backend); see --dense-memory.
  j["dense_memory"] = lm.residency().dense ? lm.residency().dense->memory : std::string();
  j["threads"] = threads;
  j["cpu_isa"] = std::string(kernels::CpuIsaName(kernels::ActiveCpuIsa()));  // kernel level used
  j["prompt_tokens"] = o.prompt_tokens;
  j["gen_tokens"] = o.gen_tokens;
  j["repeats"] = o.repeats;
  j["prefill_tokens_per_s"] = prefill;
  j["decode_tokens_per_s"] = decode;
  j["decode_bytes_per_token"] = bytes;
  j["decode_weights_per_token"] = lm.DecodeWeightsPerToken();
  j["decode_gb_per_s"] = gbps;
  j["read_bandwidth_gb_per_s"] = bw;
  j["decode_percent_of_read_bandwidth"] = bw > 0 ? 100.0 * gbps / bw : 0.0;
  if (o.profile) {
    // Milliseconds by phase, per decoded token and per prompt; "other" is the forward's time
    // outside the phases (norms, residual adds, embedding), "step" the whole decode step with
    // the bench loop's argmax, "prompt" the whole prefill.
    auto by_phase = [&](const PhaseTimes& times, double per, const char* total_name,
                        double total_ms) {
      nlohmann::ordered_json p;
      double inside = 0;
      for (size_t i = 0; i < kPhaseNames.size(); ++i) {
        const double ms = 1e3 * times.seconds[i] / per;
        p[kPhaseNames[i]] = ms;
        if (static_cast<Phase>(i) != Phase::kForward) inside += ms;
      }
      p["other"] = 1e3 * times[Phase::kForward] / per - inside;
      p[total_name] = total_ms;
      return p;
    };
    const auto decode_p =
        by_phase(decode_times, static_cast<double>(o.gen_tokens * o.repeats), "step", 1e3 / decode);
    const auto prefill_p = by_phase(prefill_times, static_cast<double>(o.repeats), "prompt",
                                    1e3 * static_cast<double>(o.prompt_tokens) / prefill);
    j["decode_phase_ms_per_token"] = decode_p;
    j["prefill_phase_ms_per_prompt"] = prefill_p;
    for (const auto& [name, ms] : decode_p.items())
      std::fprintf(stderr, "bench: decode  %-16s %8.3f ms/token\n", name.c_str(), ms.get<double>());
    for (const auto& [name, ms] : prefill_p.items())
      std::fprintf(stderr, "bench: prefill %-16s %8.3f ms/prompt\n", name.c_str(),
                   ms.get<double>());
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("experts  %s, held as %s\n",
                std::string(DTypeName(lm.residency().stored_dtype)).c_str(),
                HeldDTypes(lm).c_str());
    std::printf("prefill  %.1f tokens/s (%lld-token prompt; %s kernels, %d threads)\n", prefill,
                static_cast<long long>(o.prompt_tokens),
                std::string(kernels::CpuIsaName(kernels::ActiveCpuIsa())).c_str(), threads);
    std::printf(
        "decode   %.2f tokens/s, %.1f MB/token, %.1f GB/s = %.0f%% of the %.1f GB/s read "
        "bandwidth\n",
        decode, static_cast<double>(bytes) / 1e6, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0, bw);
  }
  return 0;
}

}  // namespace

Command AddBenchCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "bench",
      "Measure prefill and decode tokens/s, the weight bytes a decoded token reads, the GB/s that "
      "achieves, and the machine's read bandwidth in the same run (medians of --repeats runs).");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for prefill")
      ->check(WholeNumber(1, kMaxContext));
  cmd->add_option("--gen-tokens", o->gen_tokens, "Tokens to decode")
      ->check(WholeNumber(1, kMaxContext));
  cmd->add_option("--repeats", o->repeats, "Runs; the median is reported")
      ->check(WholeNumber(1, 1000));
  cmd->add_flag("--json", o->json, "Print one JSON object on stdout");
  cmd->add_option("--bandwidth-mib", o->bandwidth_mib,
                  "Buffer for the read-bandwidth measurement, MiB (far past any cache, so the "
                  "figure is DRAM's; at most half of the RAM available)")
      ->check(FiniteNumber(1, 1 << 24));
  cmd->add_flag("--profile", o->profile,
                "Also time each phase of the decode step and of the prefill (attention, router, "
                "experts, lm_head, ...) and report milliseconds per decoded token and per prompt "
                "(stderr; JSON keys decode_phase_ms_per_token, prefill_phase_ms_per_prompt)");
  return {cmd, [o]() -> int { return Run(*o); }};
}

}  // namespace moetier::cli
