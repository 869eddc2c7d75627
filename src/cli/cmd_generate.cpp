// moetier generate: continue a prompt given as token ids (prints ids) or as text (prints text).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "cli/text_options.h"
#include "engine/generate.h"
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

// What a finished generation tells the user on stderr besides its output.
void ReportFinish(StopReason reason, int64_t ctx_size) {
  if (reason == StopReason::kContextFull)
    std::fprintf(stderr,
                 "(stopped: the context of %lld positions is full; raise --ctx-size for longer "
                 "output)\n",
                 static_cast<long long>(ctx_size));
}

// --tokens: the generation options from the flags alone (greedy unless told otherwise).
GenerateOptions TokenOptions(const SamplingFlags& f) {
  GenerateOptions g;
  g.max_new_tokens = f.max_new_tokens;
  SamplerOptions& s = g.sampler;
  s.temperature = f.temperature.value_or(0.0f);
  s.top_k = f.top_k.value_or(0);
  s.top_p = f.top_p.value_or(1.0f);
  s.min_p = f.min_p.value_or(0.0f);
  s.repetition_penalty = f.repetition_penalty.value_or(1.0f);
  s.seed = SeedFrom(f);
  return g;
}

int RunTokens(const Opts& o) {
  auto ids = ParseTokenList(o.tokens, "--tokens");
  if (!ids.ok()) return ReportError(ids.message());
  GenerateOptions g = TokenOptions(o.sampling);
  if (Status s = ValidateSamplerOptions(g.sampler); !s.ok()) return ReportError(s.message());
  auto model = LoadModel(o.model, [&](const ModelConfig& config) -> Status {
    MT_RETURN_IF_ERROR(CheckTokenIds(*ids, config, "--tokens"));
    if (!o.sampling.ignore_eos) {
      MT_ASSIGN_OR_RETURN(g.stop_ids, ReadStopTokenIds(o.model.model_dir, config));
    }
    return OkStatus();
  });
  if (!model.ok()) return ReportError(model.message());
  auto engine = MakeEngine(o.model, **model, nullptr);
  if (!engine.ok()) return ReportError(engine.message());
  std::string line;
  if (g.max_new_tokens > 0) {
    auto out = Generate(**engine, *ids, g);
    if (!out.ok()) return ReportError(out.message());
    for (size_t i = 0; i < out->ids.size(); ++i) {
      if (i) line.push_back(',');
      line.append(std::to_string(out->ids[i]));
    }
    ReportFinish(out->reason, (*engine)->sequence_limit());
  }
  std::printf("%s\n", line.c_str());
  if (Status s = FinishModel(o.model, **model); !s.ok()) return ReportError(s.message());
  return 0;
}

// The prompt's ids: the text, or the chat template's rendering of it as a user message.
Expected<std::vector<int32_t>> PromptIds(const Opts& o, const text::Tokenizer& tok) {
  if (!o.chat) return tok.Encode(o.prompt, /*add_special_tokens=*/true);  // as tokenizer(text)
  MT_ASSIGN_OR_RETURN(text::ChatTemplate chat, text::ChatTemplate::Load(o.model.model_dir));
  text::ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) in.messages.push_back({{"role", "system"}, {"content", o.system}});
  in.messages.push_back({{"role", "user"}, {"content", o.prompt}});
  in.tools = nullptr;
  in.add_generation_prompt = true;
  MT_ASSIGN_OR_RETURN(std::string rendered, chat.Render(in));
  return tok.Encode(rendered, /*add_special_tokens=*/false);  // the template writes BOS
}

int RunText(Opts o) {
  if (!o.prompt_file.empty()) {
    auto text = ReadInputFile(o.prompt_file, "--prompt-file");
    if (!text.ok()) return ReportError(text.message());
    o.prompt = *text;
  }
  auto tok = text::Tokenizer::Load(o.model.model_dir);
  if (!tok.ok()) return ReportError(tok.message());
  auto ids = PromptIds(o, *tok);
  if (!ids.ok()) return ReportError(ids.message());
  if (ids->empty()) return ReportError("--prompt: the prompt encodes to no tokens");
  TextGenerationOptions opts;
  auto model = LoadModel(o.model, [&](const ModelConfig& config) -> Status {
    MT_ASSIGN_OR_RETURN(opts, MakeTextOptions(o.sampling, o.model.model_dir, config, *tok,
                                              /*use_model_defaults=*/false));
    return CheckTokenIds(*ids, config, "--prompt (tokenizer.json and the model disagree)");
  });
  if (!model.ok()) return ReportError(model.message());
  auto engine = MakeEngine(o.model, **model, &*tok);
  if (!engine.ok()) return ReportError(engine.message());
  auto r = GenerateText(**engine, *ids, opts, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  if (!r.ok()) return ReportError(r.message());
  std::printf("\n");
  ReportFinish(r->reason, (*engine)->sequence_limit());
  if (Status s = FinishModel(o.model, **model); !s.ok()) return ReportError(s.message());
  return 0;
}

}  // namespace

Command AddGenerateCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "generate",
      "Continue a prompt. With --tokens, prints the generated token ids, comma-separated, as the "
      "last line of stdout. With --prompt, streams the generated text (--chat wraps the prompt "
      "in the model's chat template as a user message). Greedy unless --temperature is given. "
      "Generation stops at an end-of-sequence token, a --stop string, --max-new-tokens or the "
      "end of the context (said on stderr).");
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
  auto* chat =
      cmd->add_flag("--chat", o->chat, "Render --prompt as a user message with the chat template");
  auto* system = cmd->add_option("--system", o->system, "System message for --chat");
  tokens->excludes(chat);
  system->needs(chat);
  AddSamplingFlags(*cmd, o->sampling, 32);
  cmd->callback([o, tokens, prompt, prompt_file] {
    if (tokens->count() == 0 && prompt->count() == 0 && prompt_file->count() == 0)
      throw CLI::RequiredError("--tokens, --prompt or --prompt-file");
    o->use_tokens = tokens->count() > 0;
  });

  return {cmd, [o]() -> int { return o->use_tokens ? RunTokens(*o) : RunText(*o); }};
}

}  // namespace moetier::cli
