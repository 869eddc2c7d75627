// moetier bench: prefill and decode speed, against the machine's read bandwidth measured in the
// same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "backend/kv_cache.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "cli/text_options.h"
#include "core/log.h"
#include "engine/bandwidth.h"
#include "engine/engine.h"
#include "experts/memory_limits.h"
#include "kernels/cpu/cpu_isa.h"

namespace moetier::cli {

namespace {

struct Opts {
  ModelOptions model;
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 32;
  int repeats = 3;
  int64_t parallel = 1;  // sequences decoding together
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;
  bool json = false;
  bool profile = false;
  double bandwidth_mib = static_cast<double>(kBandwidthBufferBytes >> 20);
  // How every sequence draws its tokens (greedy unless set); sequence i's seed is i + 1. Only
  // the draw's flags (AddDrawFlags) are read; Run fills `sampling` from them.
  SamplingFlags draw;
  SamplerOptions sampling;
};

// The most of the available RAM the bandwidth buffer may take.
constexpr double kBandwidthRamShare = 0.5;

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

// Hybrid's CPU copies of pinned layers, as settled (residency_plan.h): their bytes.
uint64_t CpuCopyBytes(const CausalLM& lm) {
  const auto& settled = lm.residency().settled;
  uint64_t n = 0;
  if (settled)
    for (const LayerResidency& l : *settled) n += l.cpu_copy_bytes;
  return n;
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

// One run's figures: N sequences' prompts, then N sequences decoding together.
struct RunFigures {
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;  // all sequences together
  double decode_gb_per_s = 0;      // weight bytes the decode steps read, per second
  uint64_t kv_pool_bytes = 0;      // the run's KV pool (reserved; RAM only as positions fill)
  // The expert copies to the GPU while decoding: bytes per second of the copy engine's time on
  // them (their effective speed).
  double decode_h2d_gb_per_s = 0;
  // Hybrid, while decoding: experts fetched and computed by the CPU per decoded token (summed
  // over the layers), and the mean q* of the split steps.
  double decode_fetched_per_token = 0;
  double decode_cpu_experts_per_token = 0;
  double decode_q_star = 0;
};

// The expert stats summed over the layers so far (zeros without --moe-collect-stats).
LayerExpertStats ExpertTotals(const CausalLM& lm) {
  LayerExpertStats t;
  if (lm.expert_stats() == nullptr) return t;
  for (const LayerExpertStats& l : lm.expert_stats()->Snapshot()) t += l;
  return t;
}

// Submits one request per prompt, each generating max_new tokens drawn as `sampling` says (seed
// i + 1 for prompt i), and drives the engine until all have finished. Returns each request's
// tokens; `error` is the first failure. `on_all_started`, when set, runs once every request has
// its first token (inside that step).
std::vector<std::vector<int32_t>> RunRequests(Engine& engine,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              int64_t max_new, const SamplerOptions& sampling,
                                              Status& error,
                                              const std::function<void()>& on_all_started = {}) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  size_t started = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOptions r;
    r.prompt = prompts[i];
    r.max_new_tokens = max_new;
    r.sampler = sampling;
    r.sampler.seed = i + 1;
    engine.Submit(std::move(r), [&, i](const RequestEvent& ev) {
      if (ev.kind == RequestEvent::Kind::kToken) {
        out[i].push_back(ev.token);
        if (out[i].size() == 1 && ++started == prompts.size() && on_all_started) on_all_started();
      }
      if (ev.kind == RequestEvent::Kind::kFinished && !ev.status.ok() && error.ok())
        error = ev.status;
    });
  }
  engine.RunUntilIdle();
  return out;
}

// A run in two phases on one engine, as a server meets them. Prefill: o.parallel prompts of
// o.prompt_tokens random ids each (fixed seed: the same work every run), in steps of at most
// --max-batch-tokens, each sampling its first token. Decode: the same sequences, their whole
// blocks taken from the prefix cache; after a first step that runs what the cache does not hold
// (each first token, and a prompt's last partial block), o.gen_tokens steps in which every
// sequence decodes one token: what is timed. Phase times go to *prefill / *decode when
// profiling.
Expected<RunFigures> BenchRun(const Opts& o, CausalLM& lm, int run, PhaseTimes* prefill_times,
                              PhaseTimes* decode_times) {
  const int64_t n = o.parallel;
  EngineOptions e;
  e.max_running = static_cast<int>(n);
  e.max_batch_tokens = std::max(o.max_batch_tokens, n);  // a decode step takes every sequence
  e.kv_positions = n * (o.prompt_tokens + o.gen_tokens + 2 * KvPool::kDefaultBlockSize);
  e.max_sequence_positions = o.prompt_tokens + o.gen_tokens + 2;
  MT_ASSIGN_OR_RETURN(e.kv_dtype, ParseKvDType(KvDTypeName(o.model, lm)));
  MT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(lm, nullptr, e));
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(o.prompt_tokens));
    for (auto& t : p)
      t = static_cast<int32_t>(rng() % static_cast<uint32_t>(lm.config().vocab_size));
  }
  LogInfo("bench: run " + std::to_string(run + 1) + "/" + std::to_string(o.repeats) + ": " +
          std::to_string(n) + " sequence(s), prefill " + std::to_string(o.prompt_tokens) +
          " tokens each, decode " + std::to_string(o.gen_tokens) + " tokens each");
  using Clock = std::chrono::steady_clock;
  Status error;
  lm.SetPhaseTimes(prefill_times);
  const Clock::time_point t0 = Clock::now();
  const auto first = RunRequests(*engine, prompts, 1, o.sampling, error);
  const Clock::time_point t1 = Clock::now();
  lm.SetPhaseTimes(nullptr);
  MT_RETURN_IF_ERROR(error);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i].push_back(first[i].at(0));
  Clock::time_point decoding;
  uint64_t bytes0 = 0;
  LayerExpertStats h2d0;
  const auto decoded = RunRequests(*engine, prompts, o.gen_tokens + 1, o.sampling, error, [&] {
    decoding = Clock::now();
    bytes0 = lm.WeightBytesStreamed();
    h2d0 = ExpertTotals(lm);
    lm.SetPhaseTimes(decode_times);
  });
  const Clock::time_point t2 = Clock::now();
  lm.SetPhaseTimes(nullptr);
  MT_RETURN_IF_ERROR(error);
  for (const auto& d : decoded)
    if (static_cast<int64_t>(d.size()) != o.gen_tokens + 1)
      return Status::Error("bench: a sequence stopped after " + std::to_string(d.size()) + " of " +
                           std::to_string(o.gen_tokens + 1) + " tokens");
  RunFigures f;
  f.kv_pool_bytes = engine->kv_pool().bytes();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - decoding).count();
  f.prefill_tokens_per_s = static_cast<double>(n * o.prompt_tokens) / prefill_s;
  f.decode_tokens_per_s = static_cast<double>(n * o.gen_tokens) / decode_s;
  f.decode_gb_per_s = static_cast<double>(lm.WeightBytesStreamed() - bytes0) / 1e9 / decode_s;
  const LayerExpertStats h2d1 = ExpertTotals(lm);
  f.decode_h2d_gb_per_s = H2dGbPerS(h2d1.bytes_h2d - h2d0.bytes_h2d, h2d1.h2d_ns - h2d0.h2d_ns);
  const auto decoded_tokens = static_cast<double>(n * o.gen_tokens);
  f.decode_fetched_per_token =
      static_cast<double>(h2d1.fetched_experts - h2d0.fetched_experts) / decoded_tokens;
  f.decode_cpu_experts_per_token =
      static_cast<double>(h2d1.cpu_experts - h2d0.cpu_experts) / decoded_tokens;
  LayerExpertStats split = h2d1;
  split.split_calls -= h2d0.split_calls;
  split.q_star_sum -= h2d0.q_star_sum;
  f.decode_q_star = MeanQStar(split);
  return f;
}

int Run(const Opts& o) {
  if (o.model.ctx_size > 0 || o.model.kv_cache_gb || o.model.kv_host_gb > 0)
    return ReportError(
        "bench sizes the KV cache for its own sequences (--parallel x (--prompt-tokens + "
        "--gen-tokens)): drop --ctx-size, --kv-cache-gb and --kv-host-gb (--kv-dtype is used)");
  if (Status s = CheckBandwidthBuffer(o.bandwidth_mib); !s.ok()) return ReportError(s.message());
  if (Status s = ValidateSamplerOptions(o.sampling); !s.ok()) return ReportError(s.message());
  auto loaded = LoadModel(o.model);
  if (!loaded.ok()) return ReportError(loaded.message());
  CausalLM& lm = **loaded;
  const int threads = o.model.n_threads > 0 ? o.model.n_threads : ThreadPool::DefaultThreads();

  std::vector<double> prefill_tps, decode_tps, decode_gbps, decode_h2d, fetched, cpu_experts,
      q_star;
  uint64_t kv_pool_bytes = 0;
  PhaseTimes decode_times;   // summed over every run's decode steps (--profile)
  PhaseTimes prefill_times;  // summed over every run's prompt (--profile)
  for (int r = 0; r < o.repeats; ++r) {
    auto f = BenchRun(o, lm, r, o.profile ? &prefill_times : nullptr,
                      o.profile ? &decode_times : nullptr);
    if (!f.ok()) return ReportError(f.message());
    prefill_tps.push_back(f->prefill_tokens_per_s);
    decode_tps.push_back(f->decode_tokens_per_s);
    decode_gbps.push_back(f->decode_gb_per_s);
    decode_h2d.push_back(f->decode_h2d_gb_per_s);
    fetched.push_back(f->decode_fetched_per_token);
    cpu_experts.push_back(f->decode_cpu_experts_per_token);
    q_star.push_back(f->decode_q_star);
    kv_pool_bytes = f->kv_pool_bytes;
  }
  const uint64_t peak_rss = ReadPeakRssBytes();  // before the bandwidth buffer
  LogInfo("bench: measuring read bandwidth with " + std::to_string(threads) + " threads");
  ThreadPool pool(threads);
  const auto measured =
      MeasureReadBandwidthGbps(pool, static_cast<size_t>(o.bandwidth_mib * double(1 << 20)));
  if (!measured.ok()) return ReportError(measured.message() + " (--bandwidth-mib)");
  const double bw = *measured;

  const double prefill = Median(prefill_tps), decode = Median(decode_tps);
  const uint64_t bytes = lm.DecodeBytesPerToken();
  // The weights the decode steps read, per second: with one sequence, decode x bytes per token;
  // with several, each step reads every dense matrix once and each expert any of them chose.
  const double gbps = Median(decode_gbps);
  const double per_sequence = decode / static_cast<double>(o.parallel);
  nlohmann::ordered_json j;
  j["model"] = o.model.model_dir;
  j["backend"] = std::string(BackendName(lm.residency().plan.backend));
  // The experts' dtype as stored (the model's), and as held for the kernels: --weight-packing
  // may hold bf16 as bf16c (the same values; decode_bytes_per_token counts the held bytes).
  j["dtype"] = std::string(DTypeName(lm.residency().stored_dtype));
  j["held_dtype"] = HeldDTypes(lm);
  j["cpu_copy_bytes"] = CpuCopyBytes(lm);  // hybrid: what the CPU's share reads (BF16C)
  // Where the dense matrices stream from: "copy" (anonymous memory), "mapped" (the model file's
  // mapping) or "" (another backend); see --dense-memory.
  j["dense_memory"] = lm.residency().dense ? lm.residency().dense->memory : std::string();
  j["threads"] = threads;
  j["cpu_isa"] = std::string(kernels::CpuIsaName(kernels::ActiveCpuIsa()));  // kernel level used
  j["prompt_tokens"] = o.prompt_tokens;
  j["gen_tokens"] = o.gen_tokens;
  j["repeats"] = o.repeats;
  j["parallel"] = o.parallel;
  j["sampling"] = {{"temperature", o.sampling.temperature},
                   {"top_k", o.sampling.top_k},
                   {"top_p", o.sampling.top_p},
                   {"min_p", o.sampling.min_p},
                   {"repetition_penalty", o.sampling.repetition_penalty}};
  j["prefill_tokens_per_s"] = prefill;
  j["decode_tokens_per_s"] = decode;  // all sequences together
  j["decode_tokens_per_s_per_sequence"] = per_sequence;
  j["decode_bytes_per_token"] = bytes;
  j["decode_weights_per_token"] = lm.DecodeWeightsPerToken();
  j["decode_gb_per_s"] = gbps;
  j["read_bandwidth_gb_per_s"] = bw;
  j["decode_percent_of_read_bandwidth"] = bw > 0 ? 100.0 * gbps / bw : 0.0;
  // Memory: the process's peak resident set beside what it is bounded by (the weights as held
  // plus a run's KV pool, which is only touched as positions fill).
  j["peak_rss_bytes"] = peak_rss;
  j["weight_bytes"] = lm.WeightBytes();
  j["kv_pool_bytes"] = kv_pool_bytes;
  j["kv_dtype"] = KvDTypeName(o.model, lm);
  // Steps of every run (and the bandwidth-free warm-up) replayed from CUDA graphs (gpu decode).
  j["graph_replayed_steps"] = lm.ReplayedSteps();
  if (o.profile) {
    // Milliseconds by phase, per decoded token and per prompt; "other" is the forward's time
    // outside the host's phases (norms, residual adds, embedding; on a GPU the launches), "step"
    // the whole decode step with the bench loop's argmax, "prompt" the whole prefill. On a GPU
    // the host's phases time launches and waits; gpu_experts and copies are device time, cpu_share
    // hybrid's worker thread.
    auto by_phase = [&](const PhaseTimes& times, double per, const char* total_name,
                        double total_ms) {
      nlohmann::ordered_json p;
      double inside = 0;
      for (size_t i = 0; i < kPhaseNames.size(); ++i) {
        const double ms = 1e3 * times.seconds[i] / per;
        p[kPhaseNames[i]] = ms;
        const auto phase = static_cast<Phase>(i);
        if (phase != Phase::kForward && !IsConcurrentPhase(phase)) inside += ms;
      }
      p["other"] = 1e3 * times[Phase::kForward] / per - inside;
      p[total_name] = total_ms;
      return p;
    };
    // Per decoded token of one sequence (a step), and per prompt (all of a run's prompts).
    const auto decode_p = by_phase(decode_times, static_cast<double>(o.gen_tokens * o.repeats),
                                   "step", 1e3 / per_sequence);
    const auto prefill_p =
        by_phase(prefill_times, static_cast<double>(o.repeats), "prompt",
                 1e3 * static_cast<double>(o.prompt_tokens * o.parallel) / prefill);
    j["decode_phase_ms_per_token"] = decode_p;
    j["prefill_phase_ms_per_prompt"] = prefill_p;
    for (const auto& [name, ms] : decode_p.items())
      std::fprintf(stderr, "bench: decode  %-16s %8.3f ms/token\n", name.c_str(), ms.get<double>());
    for (const auto& [name, ms] : prefill_p.items())
      std::fprintf(stderr, "bench: prefill %-16s %8.3f ms/prompt\n", name.c_str(),
                   ms.get<double>());
  }
  if (lm.expert_stats() != nullptr) {
    const auto layers = lm.expert_stats()->Snapshot();
    j["expert_stats"] = ExpertStatsJson(layers);
    const nlohmann::ordered_json& t = j["expert_stats"]["totals"];
    j["cache_hit_rate"] = t["cache_hit_rate"];
    j["cpu_experts"] = t["cpu_experts"];
    j["gpu_experts"] = t["gpu_experts"];
    j["h2d_gb_per_s"] = Median(decode_h2d);  // effective speed of the misses' copies in decode
    // Decode, per token (summed over layers): experts copied to the GPU and computed by the CPU
    // executor (hybrid's split, offload's CPU layers); the hybrid split's mean q*.
    j["fetched_experts_per_token"] = Median(fetched);
    j["cpu_experts_per_token"] = Median(cpu_experts);
    j["q_star"] = Median(q_star);
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("experts  %s, held as %s%s\n",
                std::string(DTypeName(lm.residency().stored_dtype)).c_str(), HeldDTypes(lm).c_str(),
                CpuCopyBytes(lm) > 0 ? " (pinned layers with a CPU copy)" : "");
    std::printf("prefill  %.1f tokens/s (%lld-token prompt; %s kernels, %d threads)\n", prefill,
                static_cast<long long>(o.prompt_tokens),
                std::string(kernels::CpuIsaName(kernels::ActiveCpuIsa())).c_str(), threads);
    if (o.parallel > 1)
      std::printf(
          "decode   %.2f tokens/s over %lld sequences (%.2f each), %.1f GB/s of weights = "
          "%.0f%% of the %.1f GB/s read bandwidth\n",
          decode, static_cast<long long>(o.parallel), per_sequence, gbps,
          bw > 0 ? 100.0 * gbps / bw : 0.0, bw);
    else
      std::printf(
          "decode   %.2f tokens/s, %.1f MB/token, %.1f GB/s = %.0f%% of the %.1f GB/s read "
          "bandwidth\n",
          decode, static_cast<double>(bytes) / 1e6, gbps, bw > 0 ? 100.0 * gbps / bw : 0.0, bw);
  }
  if (Status s = FinishModel(o.model, lm); !s.ok()) return ReportError(s.message());
  return 0;
}

}  // namespace

Command AddBenchCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "bench",
      "Measure prefill and decode tokens/s, the weight bytes a decoded token reads, the GB/s that "
      "achieves, and the machine's read bandwidth in the same run (medians of --repeats runs), "
      "for one sequence or --parallel N decoding together on the engine.");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for prefill")
      ->check(WholeNumber(1, kMaxContext));
  cmd->add_option("--gen-tokens", o->gen_tokens, "Tokens to decode")
      ->check(WholeNumber(1, kMaxContext));
  cmd->add_option("--repeats", o->repeats, "Runs; the median is reported")
      ->check(WholeNumber(1, 1000));
  cmd->add_option("--parallel", o->parallel,
                  "Sequences decoding together after their prompts (prefilled in one step): "
                  "decode tokens/s is then the aggregate over all of them (JSON: "
                  "decode_tokens_per_s, and decode_tokens_per_s_per_sequence)")
      ->check(WholeNumber(1, 4096));
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Tokens per engine step while the prompts are prefilled (chunks of prompts, "
                  "as a server runs them)")
      ->check(WholeNumber(1, kMaxContext));
  cmd->add_flag("--json", o->json, "Print one JSON object on stdout");
  cmd->add_option("--bandwidth-mib", o->bandwidth_mib,
                  "Buffer for the read-bandwidth measurement, MiB (far past any cache, so the "
                  "figure is DRAM's; at most half of the RAM available)")
      ->check(FiniteNumber(1, 1 << 24));
  AddDrawFlags(
      *cmd->add_option_group("Sampling",
                             "How the sequences draw their tokens (greedy by default; seed i + 1 "
                             "for sequence i). A greedy step hands back each row's arg-max "
                             "alone; a sampled one copies the logits to the host and draws "
                             "there: these measure the difference"),
      o->draw);
  cmd->add_flag("--profile", o->profile,
                "Also time each phase of the decode step and of the prefill (attention, router, "
                "experts, lm_head, ...) and report milliseconds per decoded token and per prompt "
                "(stderr; JSON keys decode_phase_ms_per_token, prefill_phase_ms_per_prompt)");
  return {cmd, [o]() -> int {
            ApplyDrawFlags(o->draw, o->sampling);
            return Run(*o);
          }};
}

}  // namespace moetier::cli
