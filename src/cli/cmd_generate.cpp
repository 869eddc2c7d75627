// moetier generate: continue a prompt of token ids.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/generate.h"
#include "model/generation_config.h"

namespace moetier::cli {

Command AddGenerateCommand(CLI::App& root) {
  struct Opts {
    ModelOptions model;
    std::string tokens;
    int64_t max_new_tokens = 32;
    float temperature = 0.0f;
    uint64_t seed = 0;
    bool ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "generate",
      "Continue a prompt. Prints the generated token ids, comma-separated, as the last line of "
      "stdout.");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--tokens", o->tokens, "Prompt token ids, comma-separated, e.g. 3,17,42")
      ->required();
  cmd->add_option("-n,--max-new-tokens", o->max_new_tokens, "Most tokens to generate")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", o->temperature,
                  "Sampling temperature; 0 (the default) picks the most likely token")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o->seed, "Random seed for sampling; the same seed repeats a run");
  cmd->add_flag("--ignore-eos", o->ignore_eos,
                "Keep generating after an end-of-sequence token (from generation_config.json)");

  return {cmd, [o]() -> int {
            auto ids = ParseTokenList(o->tokens, "--tokens");
            if (!ids.ok()) return ReportError(ids.message());
            auto model = LoadModel(o->model);
            if (!model.ok()) return ReportError(model.message());
            CausalLM& lm = **model;
            GenerateOptions g;
            g.max_new_tokens = o->max_new_tokens;
            g.sampler.temperature = o->temperature;
            g.sampler.seed = o->seed;
            if (!o->ignore_eos) {
              auto stop = ReadStopTokenIds(o->model.model_dir, lm.config());
              if (!stop.ok()) return ReportError(stop.message());
              g.stop_ids = *stop;
            }
            KvCache cache = lm.NewCache(ContextSize(o->model, lm));
            if (o->max_new_tokens == 0) {
              std::printf("\n");
              return 0;
            }
            auto out = Generate(lm, cache, *ids, g);
            if (!out.ok()) return ReportError(out.message());
            std::string line;
            for (size_t i = 0; i < out->size(); ++i) {
              if (i) line += ',';
              line += std::to_string((*out)[i]);
            }
            std::printf("%s\n", line.c_str());
            return 0;
          }};
}

}  // namespace moetier::cli
