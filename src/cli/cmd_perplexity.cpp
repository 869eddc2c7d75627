// moetier perplexity: a model's perplexity over a text file, windowed as llama.cpp's
// llama-perplexity does (engine/perplexity.h), so a conversion's loss (q8_0, q4_0 against bf16)
// and the two engines compare on the same weights and text.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "core/log.h"
#include "engine/perplexity.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::cli {

namespace {

struct Opts {
  ModelOptions model;
  std::string file;
  int64_t ctx = 512;
  int64_t chunks = -1;
  int parallel = 4;
  bool json = false;
};

// The token the tokenizer puts before any text (a BOS), when it puts one.
std::optional<int32_t> BosOf(const text::Tokenizer& tok) {
  const std::vector<int32_t> around = tok.Encode("", /*add_special_tokens=*/true);
  const std::vector<int32_t> text = tok.Encode("a", /*add_special_tokens=*/true);
  if (around.empty() || text.empty() || text.front() != around.front()) return std::nullopt;
  return around.front();
}

// "[window / windows] running perplexity", redrawn on a terminal, every 10 % in a log.
PerplexityProgress ProgressLine() {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  return [tty, decile = -1](int64_t done, int64_t total, double running) mutable {
    if (GetLogLevel() < LogLevel::kInfo) return;
    const int now = static_cast<int>(10 * done / total);
    if (!tty && now == decile) return;
    decile = now;
    std::fprintf(stderr,
                 tty ? "\rperplexity: window %lld/%lld, %.4f so far\x1b[K"
                     : "perplexity: window %lld/%lld, %.4f so far\n",
                 static_cast<long long>(done), static_cast<long long>(total), running);
    if (tty && done == total) std::fputc('\n', stderr);
  };
}

int RunPerplexity(const Opts& o) {
  auto text = ReadInputFile(o.file, "--file");
  if (!text.ok()) return ReportError(text.message());
  auto tok = text::Tokenizer::Load(o.model.model_dir);
  if (!tok.ok()) return ReportError(tok.message());
  const std::vector<int32_t> tokens = tok->Encode(*text, /*add_special_tokens=*/true);
  PerplexityOptions p;
  p.ctx = o.ctx;
  p.max_windows = o.chunks;
  p.bos = BosOf(*tok);
  if (static_cast<int64_t>(tokens.size()) < 2 * p.ctx)
    return ReportError(o.file + " tokenizes to " + std::to_string(tokens.size()) +
                       " tokens; windows of --ctx " + std::to_string(p.ctx) + " need at least " +
                       std::to_string(2 * p.ctx) + " (a longer text or a smaller --ctx)");
  auto model = LoadModel(o.model, [&](const ModelConfig& config) -> Status {
    if (config.max_position_embeddings > 0 && p.ctx > config.max_position_embeddings)
      return Status::Error("--ctx " + std::to_string(p.ctx) + ": the model's window is " +
                           std::to_string(config.max_position_embeddings) + " positions");
    return OkStatus();
  });
  if (!model.ok()) return ReportError(model.message());
  auto engine = MakeEngine(o.model, **model, nullptr, o.parallel, kDefaultMaxBatchTokens);
  if (!engine.ok()) return ReportError(engine.message());
  const auto start = std::chrono::steady_clock::now();
  auto r = MeasurePerplexity(**engine, tokens, p, ProgressLine());
  if (!r.ok()) return ReportError(r.message());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens_per_s = static_cast<double>(r->windows * p.ctx) / seconds;
  if (o.json) {
    nlohmann::ordered_json j = {{"perplexity", r->perplexity}, {"plus_minus", r->plus_minus},
                                {"mean_nll", r->mean_nll},     {"tokens_scored", r->tokens_scored},
                                {"windows", r->windows},       {"ctx", p.ctx},
                                {"seconds", seconds},          {"tokens_per_s", tokens_per_s}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "perplexity: %.4f +/- %.5f (%lld tokens scored in %lld windows of %lld; %.1f s, %.1f "
        "tokens/s)\n",
        r->perplexity, r->plus_minus, static_cast<long long>(r->tokens_scored),
        static_cast<long long>(r->windows), static_cast<long long>(p.ctx), seconds, tokens_per_s);
  }
  if (Status s = FinishModel(o.model, **model); !s.ok()) return ReportError(s.message());
  return 0;
}

}  // namespace

Command AddPerplexityCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "perplexity",
      "Measure the model's perplexity over a text file as llama.cpp's llama-perplexity does: "
      "the tokens cut into windows of --ctx (each starting with the BOS token where the "
      "tokenizer adds one), the second half of each window scored. Prints the perplexity +/- "
      "its standard error; compare conversions (bf16, q8_0, q4_0) of one model, or the same "
      "GGUF weights under llama.cpp, on the same text and --ctx.");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("-f,--file", o->file, "The text to measure (UTF-8)")->required();
  cmd->add_option("-c,--ctx", o->ctx, "Tokens a window; the text needs at least two windows")
      ->check(WholeNumber(kMinPerplexityCtx, kMaxContext));
  cmd->add_option("--chunks", o->chunks, "Measure at most this many windows (-1: all)")
      ->check(WholeNumber(-1, std::numeric_limits<int64_t>::max()));
  cmd->add_option("--parallel", o->parallel, "Windows running at once")
      ->check(WholeNumber(1, std::numeric_limits<int>::max()));
  cmd->add_flag("--json", o->json, "Print one JSON object on stdout");
  return {cmd, [o]() -> int { return RunPerplexity(*o); }};
}

}  // namespace moetier::cli
