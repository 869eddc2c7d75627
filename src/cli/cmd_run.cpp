// moetier run: chat with a model in the terminal, or answer one prompt (-p).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/text_options.h"
#include "engine/chat_session.h"

namespace moetier::cli {

namespace {

// Set by SIGINT; the generation loop polls it and stops the current answer. A signal handler
// may only touch a lock-free atomic, hence this one process-wide flag.
std::atomic<bool> g_interrupted{false};

void OnSigint(int) {
  g_interrupted.store(true);
}

struct Opts {
  ModelOptions model;
  std::string prompt;
  std::string system;
  SamplingFlags sampling;
};

void PrintPiece(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

// The line on stderr for an answer that ended for a reason the user should know.
void ReportFinish(const TextGenerationResult& r, const Opts& o, const ChatSession& session) {
  if (r.reason == StopReason::kCancelled) std::fprintf(stderr, "(stopped)\n");
  if (r.reason == StopReason::kMaxTokens)
    std::fprintf(stderr, "(stopped at --max-new-tokens %lld)\n",
                 static_cast<long long>(o.sampling.max_new_tokens));
  if (r.reason == StopReason::kContextFull)
    std::fprintf(stderr,
                 "(the conversation has filled the context of %lld tokens: /reset starts a new "
                 "one, or restart with a larger --ctx-size)\n",
                 static_cast<long long>(session.ctx_size()));
}

int Run(const Opts& o) {
  // Everything that can fail without the weights fails before they load.
  auto tok = text::Tokenizer::Load(o.model.model_dir);
  if (!tok.ok()) return ReportError(tok.message());
  auto chat = text::ChatTemplate::Load(o.model.model_dir);
  if (!chat.ok()) return ReportError(chat.message());
  TextGenerationOptions opts;
  auto model = LoadModel(o.model, [&](const ModelConfig& config) -> Status {
    MT_ASSIGN_OR_RETURN(opts, MakeTextOptions(o.sampling, o.model.model_dir, config, *tok,
                                              /*use_model_defaults=*/true));
    return OkStatus();
  });
  if (!model.ok()) return ReportError(model.message());
  auto engine = MakeEngine(o.model, **model, &*tok);
  if (!engine.ok()) return ReportError(engine.message());
  ChatSession session(**engine, *tok, *chat, o.system);

  if (!o.prompt.empty()) {
    auto r = session.Ask(o.prompt, opts, PrintPiece, nullptr);
    if (!r.ok()) return ReportError(r.message());
    if (r->reason == StopReason::kContextFull && r->ids.empty())
      return ReportError("-p: the prompt is " + std::to_string(r->prompt_tokens) +
                         " tokens with the chat template, leaving no room in the context of " +
                         std::to_string(session.ctx_size()) + "; raise --ctx-size");
    std::printf("\n");
    if (r->reason == StopReason::kContextFull) ReportFinish(*r, o, session);
    if (Status s = FinishModel(o.model, **model); !s.ok()) return ReportError(s.message());
    return 0;
  }

  // Ctrl-C stops the answer being generated, not the program. No SA_RESTART: a Ctrl-C at the
  // prompt interrupts the read, and we say how to leave.
  struct sigaction sa {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  const bool tty = ::isatty(STDIN_FILENO) == 1;
  std::fprintf(stderr,
               "Chatting with %s. /reset forgets the conversation, /exit or /quit (or Ctrl-D) "
               "quits, /help lists the commands, Ctrl-C stops an answer.\n",
               o.model.model_dir.c_str());
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    std::string line;
    g_interrupted.store(false);
    if (!std::getline(std::cin, line)) {
      if (g_interrupted.load() && !std::cin.eof()) {
        std::cin.clear();
        std::fprintf(stderr, "\n(type /exit or press Ctrl-D to quit)\n");
        continue;
      }
      break;
    }
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      session.Reset();
      std::fprintf(stderr, "(conversation forgotten)\n");
      continue;
    }
    if (line == "/help") {
      std::fprintf(stderr,
                   "/reset  forget the conversation\n/exit   quit (also /quit, Ctrl-D)\n"
                   "/help   this list\nCtrl-C  stop the answer\n");
      continue;
    }
    g_interrupted.store(false);
    auto r = session.Ask(line, opts, PrintPiece, &g_interrupted);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.message().c_str());
      continue;
    }
    if (r->reason == StopReason::kContextFull && r->ids.empty()) {
      std::fprintf(stderr,
                   "(the conversation with this message is %lld tokens, more than the context "
                   "of %lld holds: /reset starts a new one, or restart with a larger "
                   "--ctx-size)\n",
                   static_cast<long long>(r->prompt_tokens),
                   static_cast<long long>(session.ctx_size()));
      continue;
    }
    std::printf("\n");
    ReportFinish(*r, o, session);
  }
  if (Status s = FinishModel(o.model, **model); !s.ok()) return ReportError(s.message());
  return 0;
}

}  // namespace

Command AddRunCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "run",
      "Chat with a model: an interactive conversation in the terminal, rendered with the model's "
      "chat template, or one answer with -p. Sampling follows generation_config.json unless "
      "flags say otherwise. Commands at the prompt: /reset (forget the conversation), /exit or "
      "/quit (or Ctrl-D), /help; Ctrl-C stops an answer.");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("-p,--prompt", o->prompt, "Answer this one message and exit");
  cmd->add_option("--system", o->system, "System message that opens the conversation");
  AddSamplingFlags(*cmd, o->sampling, 512);
  return {cmd, [o]() -> int { return Run(*o); }};
}

}  // namespace moetier::cli
