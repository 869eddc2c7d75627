// moetier logits: the logits of every prompt position, for checks against a reference.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"

namespace moetier::cli {

Command AddLogitsCommand(CLI::App& root) {
  struct Opts {
    ModelOptions model;
    std::string tokens;
    std::string out;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "logits",
      "Run a prompt of token ids and write the logits of every position to a file: raw "
      "little-endian float32, row-major [n_tokens, vocab].");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--tokens", o->tokens, "Prompt token ids, comma-separated, e.g. 3,17,42")
      ->required();
  cmd->add_option("-o,--out", o->out, "Output file for the float32 logits")->required();

  return {cmd, [o]() -> int {
            auto ids = ParseTokenList(o->tokens, "--tokens");
            if (!ids.ok()) return ReportError(ids.message());
            if (Status s = CheckWritableFile(o->out, "--out"); !s.ok())
              return ReportError(s.message());
            auto model = LoadModel(o->model, [&](const ModelConfig& config) {
              return CheckTokenIds(*ids, config, "--tokens");
            });
            if (!model.ok()) return ReportError(model.message());
            CausalLM& lm = **model;
            // Exactly the prompt's positions: logits runs one sequence and keeps nothing.
            auto made = lm.NewCache(static_cast<int64_t>(ids->size()));
            if (!made.ok()) return ReportError(made.message());
            KvCache cache = std::move(made).value();
            std::vector<float> logits;
            Status s = lm.Forward(*ids, cache, LogitsFor::kAllTokens, logits);
            if (!s.ok()) return ReportError(s.message());
            std::FILE* f = std::fopen(o->out.c_str(), "wb");
            if (f == nullptr) return ReportError(o->out + ": cannot open for writing");
            // x86-64 and AArch64 Linux are little-endian, so the floats go out as they are.
            const size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
            const bool closed = std::fclose(f) == 0;
            if (n != logits.size() || !closed) return ReportError(o->out + ": write failed");
            std::fprintf(stderr, "wrote [%zu, %lld] float32 logits to %s\n", ids->size(),
                         static_cast<long long>(lm.config().vocab_size), o->out.c_str());
            if (Status fs = FinishModel(o->model, lm); !fs.ok()) return ReportError(fs.message());
            return 0;
          }};
}

}  // namespace moetier::cli
