// moetier generate: continue a prompt given as token ids (prints ids) or as text (prints text).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/text_options.h"
#include "engine/generate.h"
#include "io/mapped_file.h"
#include "model/generation_config.h"

namespace moetier::cli {

namespace {

struct Opts {
  ModelOptions model;
  std::string tokens;
  std::string prompt;
  std::string prompt_file;
  bool chat = false;
  std::string system;
  SamplingFlags sampling;
  bool use_tokens = false;  // --tokens was given
};

int RunTokens(const Opts& o, CausalLM& lm) {
  auto ids = ParseTokenList(o.tokens, "--tokens");
  if (!ids.ok()) return ReportError(ids.message());
  GenerateOptions g;
  g.max_new_tokens = o.sampling.max_new_tokens;
  SamplerOptions& s = g.sampler;
  s.temperature = o.sampling.temperature.value_or(0.0f);
  s.top_k = o.sampling.top_k.value_or(0);
  s.top_p = o.sampling.top_p.value_or(1.0f);
  s.min_p = o.sampling.min_p.value_or(0.0f);
  s.repetition_penalty = o.sampling.repetition_penalty.value_or(1.0f);
  s.seed = o.sampling.seed.value_or(std::random_device{}());
  if (!o.sampling.ignore_eos) {
    auto stop = ReadStopTokenIds(o.model.model_dir, lm.config());
    if (!stop.ok()) return ReportError(stop.message());
    g.stop_ids = *stop;
  }
  std::string line;
  if (g.max_new_tokens > 0) {
    KvCache cache = lm.NewCache(ContextSize(o.model, lm));
    auto out = Generate(lm, cache, *ids, g);
    if (!out.ok()) return ReportError(out.message());
    for (size_t i = 0; i < out->size(); ++i) {
      if (i) line.push_back(',');
      line.append(std::to_string((*out)[i]));
    }
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

int RunText(Opts o, CausalLM& lm) {
  if (!o.prompt_file.empty()) {
    auto text = ReadTextFile(o.prompt_file);
    if (!text.ok()) return ReportError(text.message() + " (--prompt-file)");
    o.prompt = *text;
  }
  auto tok = text::Tokenizer::Load(o.model.model_dir);
  if (!tok.ok()) return ReportError(tok.message());
  std::vector<int32_t> ids;
  if (o.chat) {
    auto chat = text::ChatTemplate::Load(o.model.model_dir);
    if (!chat.ok()) return ReportError(chat.message());
    text::ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::array();
    if (!o.system.empty()) in.messages.push_back({{"role", "system"}, {"content", o.system}});
    in.messages.push_back({{"role", "user"}, {"content", o.prompt}});
    in.tools = nullptr;
    in.add_generation_prompt = true;
    auto rendered = chat->Render(in);
    if (!rendered.ok()) return ReportError(rendered.message());
    ids = tok->Encode(*rendered, /*add_special_tokens=*/false);  // the template writes BOS
  } else {
    ids = tok->Encode(o.prompt, /*add_special_tokens=*/true);  // as tokenizer(text) does
  }
  if (ids.empty()) return ReportError("--prompt: the prompt encodes to no tokens");
  auto opts =
      MakeTextOptions(o.sampling, o.model.model_dir, lm, *tok, /*use_model_defaults=*/false);
  if (!opts.ok()) return ReportError(opts.message());
  KvCache cache = lm.NewCache(ContextSize(o.model, lm));
  auto r = GenerateText(lm, cache, *tok, ids, *opts, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (!r.ok()) return ReportError(r.message());
  std::printf("\n");
  return 0;
}

}  // namespace

Command AddGenerateCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "generate",
      "Continue a prompt. With --tokens, prints the generated token ids, comma-separated, as the "
      "last line of stdout. With --prompt, streams the generated text (--chat wraps the prompt "
      "in the model's chat template as a user message). Greedy unless --temperature is given.");
  AddModelOptions(*cmd, o->model);
  auto* tokens =
      cmd->add_option("--tokens", o->tokens, "Prompt token ids, comma-separated, e.g. 3,17,42");
  auto* prompt = cmd->add_option("-p,--prompt", o->prompt,
                                 "Prompt text (needs tokenizer.json beside the model)");
  auto* prompt_file = cmd->add_option("-f,--prompt-file", o->prompt_file,
                                      "Read the prompt text from this file, byte for byte");
  tokens->excludes(prompt);
  tokens->excludes(prompt_file);
  prompt->excludes(prompt_file);
  cmd->add_flag("--chat", o->chat, "Render --prompt as a user message with the chat template");
  cmd->add_option("--system", o->system, "System message for --chat");
  AddSamplingFlags(*cmd, o->sampling, 32);
  cmd->callback([o, tokens, prompt, prompt_file] {
    if (tokens->count() == 0 && prompt->count() == 0 && prompt_file->count() == 0)
      throw CLI::RequiredError("--tokens, --prompt or --prompt-file");
    o->use_tokens = tokens->count() > 0;
  });

  return {cmd, [o]() -> int {
            auto model = LoadModel(o->model);
            if (!model.ok()) return ReportError(model.message());
            return o->use_tokens ? RunTokens(*o, **model) : RunText(*o, **model);
          }};
}

}  // namespace moetier::cli
