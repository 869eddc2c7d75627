#include "cli/text_options.h"

#include <limits>
#include <random>

#include "cli/flags.h"

#include "model/generation_config.h"

namespace moetier::cli {

void AddSamplingFlags(CLI::App& cmd, SamplingFlags& f, int64_t default_max_new_tokens) {
  f.max_new_tokens = default_max_new_tokens;
  auto* g = cmd.add_option_group("Sampling");
  g->add_option("-n,--max-new-tokens", f.max_new_tokens,
                "Most tokens to generate (generation also stops at the end of the context, "
                "finish reason 'length')")
      ->check(WholeNumber(0));
  AddDrawFlags(*g, f);
  g->add_option("--seed", f.seed,
                "Random seed: the same seed repeats a run; -1 = a random seed (the default)")
      ->check(WholeNumber(-1));
  g->add_option("--stop", f.stop, "Stop before this text (repeatable)")->default_str("");
  g->add_flag("--ignore-eos", f.ignore_eos, "Keep generating after an end-of-sequence token");
}

void AddDrawFlags(CLI::Option_group& g, SamplingFlags& f) {
  g.add_option("--temperature", f.temperature,
               "Sampling temperature; 0 picks the most likely token")
      ->check(FiniteNumber(0));
  g.add_option("--top-k", f.top_k, "Sample from the k most likely tokens (0 = off)")
      ->check(WholeNumber(0, std::numeric_limits<int32_t>::max(), "off"));
  g.add_option("--top-p", f.top_p,
               "Sample from the smallest set of tokens whose probability reaches p (1 = off)")
      ->check(FiniteNumber(0, 1, /*min_open=*/true));
  g.add_option("--min-p", f.min_p,
               "Drop tokens less likely than min-p times the most likely (0 = off)")
      ->check(FiniteNumber(0, 1));
  g.add_option("--repetition-penalty", f.repetition_penalty,
               "Divide the logits of tokens already in the context by this (1 = off)")
      ->check(FiniteNumber(0, std::numeric_limits<double>::max(), /*min_open=*/true));
}

void ApplyDrawFlags(const SamplingFlags& f, SamplerOptions& s) {
  if (f.temperature) s.temperature = *f.temperature;
  if (f.top_k) s.top_k = *f.top_k;
  if (f.top_p) s.top_p = *f.top_p;
  if (f.min_p) s.min_p = *f.min_p;
  if (f.repetition_penalty) s.repetition_penalty = *f.repetition_penalty;
}

uint64_t SeedFrom(const SamplingFlags& f) {
  return f.seed && *f.seed >= 0 ? static_cast<uint64_t>(*f.seed) : std::random_device{}();
}

Expected<TextGenerationOptions> MakeTextOptions(const SamplingFlags& f,
                                                const std::string& model_dir,
                                                const ModelConfig& config,
                                                const text::Tokenizer& tokenizer,
                                                bool use_model_defaults) {
  TextGenerationOptions o;
  SamplerOptions& s = o.tokens.sampler;
  if (use_model_defaults) {
    MT_ASSIGN_OR_RETURN(SamplingDefaults d, ReadSamplingDefaults(model_dir));
    // generation_config.json's values apply when it asks for sampling, as transformers does.
    if (d.do_sample.value_or(false)) {
      s.temperature = d.temperature.value_or(1.0f);
      s.top_k = d.top_k.value_or(50);  // transformers' default top_k
      s.top_p = d.top_p.value_or(1.0f);
      s.min_p = d.min_p.value_or(0.0f);
    }
    s.repetition_penalty = d.repetition_penalty.value_or(1.0f);
  }
  ApplyDrawFlags(f, s);
  s.seed = SeedFrom(f);
  MT_RETURN_IF_ERROR(ValidateSamplerOptions(s));
  o.tokens.max_new_tokens = f.max_new_tokens;
  o.stop_strings = f.stop;
  if (!f.ignore_eos) {
    MT_ASSIGN_OR_RETURN(std::vector<int32_t> eos, ReadStopTokenIds(model_dir, config));
    o.tokens.stop_ids = StopIdsFor(std::move(eos), tokenizer);
  }
  return o;
}

}  // namespace moetier::cli
