// Recall of next-layer expert prediction: how many of a MoE layer's routed experts a prefetch
// could have named one layer early, by applying layer L+1's router to layer L's MoE input (and
// to the residual after layer L through L+1's post-attention norm). The model runs on the CPU
// backend behind a PrefetchProbe (backend/prefetch_probe.h), which counts without changing a
// result. Prints one JSON object on stdout and a summary on stderr.
//
//   prefetch_recall --model DIR [--prompt-tokens 64] [--gen-tokens 64] [--seed 1] [--threads N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/prefetch_probe.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "io/mapped_file.h"
#include "model/causal_lm.h"
#include "text/tokenizer/tokenizer.h"

using namespace moetier;
using Json = nlohmann::ordered_json;

namespace {

struct Args {
  std::string model;
  int64_t prompt_tokens = 64;
  int64_t gen_tokens = 64;
  uint32_t seed = 1;
  int threads = 0;
  std::string prompt_file;
  std::string weight_packing = "auto";
  bool no_verify = false;
};

constexpr const char* kOutputHelp = R"(Output:
  stdout: one JSON object. "prefill" covers the prompt's tokens (one step), "decode" the
  generated ones (one step each, greedy). For each predictor:
    moe_input: layer L+1's router applied to x_L, the normed input of layer L's MoE block;
    residual:  layer L+1's router applied to RmsNorm(h_L) with layer L+1's post-attention
               norm, h_L the residual stream after layer L;
  recall_at_k is the fraction of the experts layer L+1's router chose (top k per token) that
  are among the predictor's k best experts, recall_at_2k among its 2k best (capped at the
  number of experts), averaged over every token and every MoE layer L+1 that follows a MoE
  layer L ("layers": per predicted layer L+1). "chance_at_k" / "chance_at_2k": the recall of a
  set picked at random (k / n_experts, 2k / n_experts).
  stderr: the same figures as a table.)";

Expected<std::vector<int32_t>> PromptIds(const Args& a, const ModelConfig& config) {
  if (!a.prompt_file.empty()) {
    MT_ASSIGN_OR_RETURN(std::string text, ReadTextFile(a.prompt_file));
    MT_ASSIGN_OR_RETURN(text::Tokenizer tok, text::Tokenizer::Load(a.model));
    std::vector<int32_t> ids = tok.Encode(text, /*add_special_tokens=*/true);
    if (static_cast<int64_t>(ids.size()) > a.prompt_tokens)
      ids.resize(static_cast<size_t>(a.prompt_tokens));
    for (int32_t id : ids)
      if (id < 0 || id >= config.vocab_size)
        return Status::Error("--prompt-file: token id " + std::to_string(id) +
                             " is outside the model's vocabulary");
    if (ids.empty()) return Status::Error("--prompt-file: the text encodes to no tokens");
    return ids;
  }
  std::mt19937 rng(a.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(config.vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(a.prompt_tokens));
  for (int32_t& t : ids) t = id(rng);
  return ids;
}

int32_t Greedy(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

Json PhaseJson(const PrefetchCounts& c, int64_t tokens) {
  Json phase = {{"tokens", tokens}};
  Json predictors = Json::object();
  for (size_t p = 0; p < kPrefetchPredictors; ++p) {
    const auto pred = static_cast<PrefetchPredictor>(p);
    Json layers = Json::array();
    for (const PrefetchCounts::Layer& l : c.layers) {
      const PrefetchCounts::Cell& cell = l.by_predictor[p];
      layers.push_back({{"layer", l.layer},
                        {"tokens", cell.tokens},
                        {"recall_at_k", c.Recall(cell, 0)},
                        {"recall_at_2k", c.Recall(cell, 1)}});
    }
    predictors[PrefetchPredictorName(pred)] = {{"token_layers", c.Tokens(pred)},
                                               {"recall_at_k", c.Recall(pred, 0)},
                                               {"recall_at_2k", c.Recall(pred, 1)},
                                               {"layers", layers}};
  }
  phase["predictors"] = predictors;
  return phase;
}

void PrintSummary(const Args& a, const PrefetchCounts& prefill, const PrefetchCounts& decode,
                  int64_t n_prompt, int64_t n_gen) {
  const PrefetchCounts& c = prefill;
  std::fprintf(stderr,
               "prefetch recall: %s, %lld experts, top-%lld; sets of k=%lld and 2k=%lld "
               "(chance %.3f / %.3f)\n",
               a.model.c_str(), static_cast<long long>(c.n_experts),
               static_cast<long long>(c.top_k), static_cast<long long>(c.set_sizes[0]),
               static_cast<long long>(c.set_sizes[1]),
               static_cast<double>(c.set_sizes[0]) / static_cast<double>(c.n_experts),
               static_cast<double>(c.set_sizes[1]) / static_cast<double>(c.n_experts));
  std::fprintf(stderr, "  %-12s %-7s prefill (%lld tok)   decode (%lld tok)\n", "predictor",
               "layer", static_cast<long long>(n_prompt), static_cast<long long>(n_gen));
  std::fprintf(stderr, "  %-12s %-7s %8s %8s   %8s %8s\n", "", "", "@k", "@2k", "@k", "@2k");
  for (size_t p = 0; p < kPrefetchPredictors; ++p) {
    const auto pred = static_cast<PrefetchPredictor>(p);
    std::fprintf(stderr, "  %-12s %-7s %8.3f %8.3f   %8.3f %8.3f\n", PrefetchPredictorName(pred),
                 "all", prefill.Recall(pred, 0), prefill.Recall(pred, 1), decode.Recall(pred, 0),
                 decode.Recall(pred, 1));
    for (size_t i = 0; i < prefill.layers.size(); ++i) {
      const PrefetchCounts::Cell& pc = prefill.layers[i].by_predictor[p];
      const PrefetchCounts::Layer* dl = nullptr;
      for (const PrefetchCounts::Layer& l : decode.layers)
        if (l.layer == prefill.layers[i].layer) dl = &l;
      const double nan = std::nan("");
      std::fprintf(stderr, "  %-12s %-7lld %8.3f %8.3f   %8.3f %8.3f\n", "",
                   static_cast<long long>(prefill.layers[i].layer), prefill.Recall(pc, 0),
                   prefill.Recall(pc, 1), dl ? decode.Recall(dl->by_predictor[p], 0) : nan,
                   dl ? decode.Recall(dl->by_predictor[p], 1) : nan);
    }
  }
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "Recall of next-layer expert prediction for prefetching: runs a prompt and a greedy "
      "continuation on the CPU backend and counts, for every token and every pair of "
      "consecutive MoE layers (L, L+1), how many of the experts layer L+1's router chose a "
      "prediction made from layer L would have named.",
      "prefetch_recall");
  app.footer(kOutputHelp);
  app.add_option("--model", a.model, "Model directory (Hugging Face or converted)")->required();
  app.add_option("--prompt-tokens", a.prompt_tokens,
                 "Prompt length: token ids drawn uniformly from the vocabulary with --seed, or "
                 "the first N tokens of --prompt-file")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--gen-tokens", a.gen_tokens,
                 "Tokens generated greedily after the prompt, one decode step each")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--seed", a.seed, "Seed of the random prompt")->capture_default_str();
  app.add_option("--prompt-file", a.prompt_file,
                 "A text file to take the prompt from instead, encoded with the model "
                 "directory's tokenizer.json");
  app.add_option("--threads", a.threads, "CPU threads (0: one per physical core)")
      ->capture_default_str();
  app.add_option("--weight-packing", a.weight_packing,
                 "auto | none | bf16c: how bf16 weights are held (as moetier's flag; the "
                 "routing, and so the figures, do not depend on it)")
      ->capture_default_str();
  app.add_flag("--no-verify", a.no_verify, "Skip the checksums of a converted model");
  CLI11_PARSE(app, argc, argv);

  LoadOptions options;
  options.n_threads = a.threads;
  options.residency.backend = Backend::kCpu;
  options.residency.use_gpu = false;  // activations in host memory, where the probe reads them
  options.residency.verify = !a.no_verify;
  auto packing = ParseWeightPacking(a.weight_packing);
  if (!packing.ok()) return Fail(packing.message());
  options.residency.packing = *packing;
  std::vector<int32_t> prompt;
  options.before_weights = [&](const ModelConfig& config) -> Status {
    MT_ASSIGN_OR_RETURN(prompt, PromptIds(a, config));
    return OkStatus();
  };
  PrefetchProbe* probe = nullptr;
  options.wrap_backend = [&probe](std::unique_ptr<ComputeBackend> inner) {
    auto p = std::make_unique<PrefetchProbe>(std::move(inner));
    probe = p.get();
    return std::unique_ptr<ComputeBackend>(std::move(p));
  };

  const auto t_load = std::chrono::steady_clock::now();
  auto model = LoadCausalLM(a.model, options);
  if (!model.ok()) return Fail(model.message());
  const double load_s = Seconds(t_load);
  if (probe == nullptr) return Fail(a.model + ": this architecture does not run on a backend");
  CausalLM& lm = **model;
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  auto cache = lm.NewCache(n_prompt + a.gen_tokens);
  if (!cache.ok()) return Fail(cache.message());

  std::vector<float> logits;
  const auto t_prefill = std::chrono::steady_clock::now();
  if (Status s = lm.Forward(prompt, *cache, LogitsFor::kLastToken, logits); !s.ok())
    return Fail(s.message());
  const double prefill_s = Seconds(t_prefill);
  const PrefetchCounts prefill = probe->TakeCounts();

  const auto t_decode = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < a.gen_tokens; ++i) {
    const int32_t next[1] = {Greedy(logits)};
    if (Status s = lm.Forward(next, *cache, LogitsFor::kLastToken, logits); !s.ok())
      return Fail(s.message());
  }
  const double decode_s = Seconds(t_decode);
  const PrefetchCounts decode = probe->TakeCounts();
  if (prefill.set_sizes.size() != 2)
    return Fail(a.model + ": the model has no MoE layer, nothing to predict");

  const ModelConfig& c = lm.config();
  const auto E = static_cast<double>(prefill.n_experts);
  Json out = {{"model", a.model},
              {"architecture", c.architecture},
              {"n_layers", c.n_layers},
              {"n_experts", prefill.n_experts},
              {"top_k", prefill.top_k},
              {"k", prefill.set_sizes[0]},
              {"2k", prefill.set_sizes[1]},
              {"chance_at_k", static_cast<double>(prefill.set_sizes[0]) / E},
              {"chance_at_2k", static_cast<double>(prefill.set_sizes[1]) / E},
              {"prompt", a.prompt_file.empty() ? "random" : a.prompt_file},
              {"seed", a.seed},
              {"prompt_tokens", n_prompt},
              {"generated_tokens", a.gen_tokens},
              {"threads", a.threads > 0 ? a.threads : ThreadPool::DefaultThreads()},
              {"seconds", {{"load", load_s}, {"prefill", prefill_s}, {"decode", decode_s}}},
              {"prefill", PhaseJson(prefill, n_prompt)},
              {"decode", PhaseJson(decode, a.gen_tokens)}};
  std::printf("%s\n", out.dump(2).c_str());
  PrintSummary(a, prefill, decode, n_prompt, a.gen_tokens);
  return 0;
}
