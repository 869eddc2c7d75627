// moetier serve: an OpenAI- and Anthropic-compatible HTTP server on the continuous-batching
// engine (server/http_server.h).
//
// It binds first and loads afterwards: the port answers at once (/health: 503 with the load's
// progress, then 200), so a supervisor knows the address is taken and can watch the load.
// SIGINT and SIGTERM stop it: the requests in flight are cancelled, the HTTP threads end, then
// the engine's.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "core/log.h"
#include "core/progress.h"
#include "engine/engine.h"
#include "server/chat_service.h"
#include "server/http_server.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::cli {

namespace {

struct Opts {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;
  int64_t max_queue = server::ChatServiceOptions{}.max_waiting;
  std::string api_key;
  std::string api_key_file;
};

// /health's progress at each stage of the load: the tokenizer read, the config read and the
// residency planned, then the expert banks (the long part: their loader's progress, scaled into
// the span up to kProgressWeightsLoaded), the dense weights and the KV cache after them.
constexpr double kProgressTokenizerLoaded = 0.02;
constexpr double kProgressPlanned = 0.05;
constexpr double kProgressWeightsLoaded = 0.95;
// HTTP threads beyond one per request the server holds (running or queued): /health and
// /metrics keep answering while every request slot is taken.
constexpr int kSpareHttpThreads = 4;
// How often the signal watcher checks whether the server has ended on its own.
constexpr long kSignalPollNanoseconds = 200'000'000;
// The exit status of a server stopped by a signal while it was still loading (128 + SIGINT, as a
// shell reports an interrupted program).
constexpr int kInterruptedExitCode = 130;

// The key from --api-key or --api-key-file (its first line, surrounding blanks removed).
Expected<std::string> ReadApiKey(const Opts& o) {
  if (o.api_key_file.empty()) return o.api_key;
  MT_ASSIGN_OR_RETURN(std::string text, ReadInputFile(o.api_key_file, "--api-key-file"));
  const size_t end_of_line = text.find_first_of("\r\n");
  if (end_of_line != std::string::npos) text.resize(end_of_line);
  const size_t first = text.find_first_not_of(" \t");
  const size_t last = text.find_last_not_of(" \t");
  if (first == std::string::npos)
    return Status::Error(o.api_key_file +
                         ": the first line is empty (--api-key-file); write the key there");
  return text.substr(first, last - first + 1);
}

std::string Address(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return "http://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// Waits for SIGINT or SIGTERM (blocked in every thread, so only this one takes them) and stops
// the server; ends by itself once `done` is set.
class SignalWatcher {
 public:
  SignalWatcher(server::HttpServer& http, const std::atomic<bool>& loaded)
      : thread_([this, &http, &loaded] { Watch(http, loaded); }) {}
  ~SignalWatcher() {
    done_ = true;
    thread_.join();
  }

  // Blocks the two signals in the calling thread and the threads it creates afterwards.
  static void BlockSignals() {
    sigset_t set = Signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

 private:
  static sigset_t Signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
  }

  void Watch(server::HttpServer& http, const std::atomic<bool>& loaded) {
    const sigset_t set = Signals();
    const timespec poll{0, kSignalPollNanoseconds};
    while (!done_) {
      const int sig = sigtimedwait(&set, nullptr, &poll);
      if (sig < 0) continue;
      std::fprintf(stderr, "stopping (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      // A load cannot be interrupted, and it holds nothing that must be written back: the
      // process ends rather than make the user wait for the weights it no longer wants.
      if (!loaded) std::_Exit(kInterruptedExitCode);
      http.Stop();
      return;
    }
  }

  std::atomic<bool> done_{false};
  std::thread thread_;
};

// What the server serves, loaded while it already answers. Each part is held by pointer, so that
// the references the later ones keep to the earlier ones survive a move of the whole.
struct Loaded {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<text::ChatTemplate> chat;  // null: the model has none
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::ChatService> service;
};

// The chat template, or null (with a warning) for a model without one: /v1/completions still
// serves raw prompts.
std::unique_ptr<text::ChatTemplate> LoadChatTemplate(const std::string& model_dir) {
  auto chat = text::ChatTemplate::Load(model_dir);
  if (chat.ok()) return std::make_unique<text::ChatTemplate>(std::move(*chat));
  LogWarn(chat.message() +
          "; /v1/chat/completions and /v1/messages will refuse requests, /v1/completions "
          "serves raw prompts");
  return nullptr;
}

Expected<Loaded> Load(const Opts& o, server::HttpServer& http) {
  Loaded l;
  auto tokenizer = text::Tokenizer::Load(o.model.model_dir);
  if (!tokenizer.ok()) return tokenizer.status().WithContext("--model");
  l.tokenizer = std::make_unique<text::Tokenizer>(std::move(*tokenizer));
  l.chat = LoadChatTemplate(o.model.model_dir);
  http.SetLoadProgress(kProgressTokenizerLoaded);
  SetProgressObserver([&http](const std::string&, double fraction) {
    http.SetLoadProgress(kProgressPlanned + fraction * (kProgressWeightsLoaded - kProgressPlanned));
  });
  auto model = LoadModel(o.model, [&http](const ModelConfig&) {
    http.SetLoadProgress(kProgressPlanned);
    return OkStatus();
  });
  SetProgressObserver(nullptr);
  MT_RETURN_IF_ERROR(model.status());
  l.model = std::move(*model);
  http.SetLoadProgress(kProgressWeightsLoaded);
  l.model->CollectExpertStats();  // the residency page's live figures (a few adds a layer)
  MT_ASSIGN_OR_RETURN(
      l.engine, MakeEngine(o.model, *l.model, l.tokenizer.get(), o.parallel, o.max_batch_tokens));
  server::ChatServiceOptions service_options;
  service_options.max_waiting = o.max_queue;
  if (const char* forced = std::getenv("MOETIER_TEST_FORCED_OUTPUT"); forced && *forced) {
    service_options.forced_output = forced;
    LogWarn("MOETIER_TEST_FORCED_OUTPUT is set: every answer begins with its text (a test hook)");
  }
  l.service = std::make_unique<server::ChatService>(*l.model, *l.engine, *l.tokenizer, l.chat.get(),
                                                    service_options);
  l.engine->Start();
  return l;
}

int RunServe(const Opts& o) {
  // The mistakes that cost nothing to find are found before the port is taken.
  auto key = ReadApiKey(o);
  if (!key.ok()) return ReportError(key.message());
  std::error_code ec;
  if (!std::filesystem::is_directory(o.model.model_dir, ec))
    return ReportError(o.model.model_dir + ": not a directory (--model); give a model directory");
  server::ServerOptions options;
  options.host = o.host;
  options.port = o.port;
  options.api_key = *key;
  const int64_t held = std::min<int64_t>(o.parallel + o.max_queue, 1 << 16);
  options.n_http_threads = static_cast<int>(held) + kSpareHttpThreads;

  SignalWatcher::BlockSignals();
  server::HttpServer http(options);
  if (Status s = http.Bind(); !s.ok()) return ReportError(s.message());
  std::fprintf(stderr, "listening on %s\n", Address(o.host, http.port()).c_str());
  std::fflush(stderr);

  std::atomic<bool> loaded{false};
  Status listen_status;
  std::thread listener([&] { listen_status = http.Listen(); });
  SignalWatcher watcher(http, loaded);
  auto state = Load(o, http);
  if (!state.ok()) {
    http.Stop();
    listener.join();
    return ReportError(state.message());
  }
  loaded = true;
  http.SetService(*state->service);
  LogInfo("ready: serving " + state->service->model_name() + " at " + Address(o.host, http.port()) +
          ", " + std::to_string(o.parallel) + " requests at once" +
          (key->empty() ? "" : ", API key required"));
  listener.join();  // until a signal stops the server (its handlers have all ended then)
  state->engine->Stop();
  if (!listen_status.ok()) return ReportError(listen_status.message());
  if (Status s = FinishModel(o.model, *state->model); !s.ok()) return ReportError(s.message());
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace

Command AddServeCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "serve",
      "Serve the model over HTTP, compatible with the OpenAI and Anthropic APIs, on the "
      "continuous-batching engine. Routes: POST /v1/chat/completions and /v1/completions "
      "(OpenAI; streaming as SSE), GET /v1/models, POST /v1/messages and "
      "/v1/messages/count_tokens (Anthropic), GET /health (503 with the load's progress while "
      "the model loads, then 200), GET /metrics (Prometheus text). The port is bound before the "
      "model loads; \"listening on http://HOST:PORT\" goes to stderr once it is. With an API key "
      "every route but /health needs 'Authorization: Bearer KEY' or 'x-api-key: KEY'. SIGINT or "
      "SIGTERM stops it, cancelling the requests in flight.");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--host", o->host,
                  "Address to listen on; 0.0.0.0 listens on every interface (set an API key)");
  cmd->add_option("--port", o->port, "TCP port; 0 = any free port (the one taken is printed)")
      ->check(WholeNumber(0, 65535, "any free port"));
  cmd->add_option("--parallel", o->parallel, "Most requests generating at once")
      ->check(WholeNumber(1, std::numeric_limits<int16_t>::max()));
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Most tokens in one engine step, over all requests (a longer prompt is "
                  "prefilled in chunks, so the others keep decoding)")
      ->check(WholeNumber(1, kMaxContext));
  cmd->add_option("--max-queue", o->max_queue,
                  "Requests waiting beyond the running ones; more are answered 503 with "
                  "Retry-After")
      ->check(WholeNumber(0, std::numeric_limits<int16_t>::max()));
  auto* key = cmd->add_option("--api-key", o->api_key,
                              "Require this key from clients (visible in the process list: "
                              "prefer --api-key-file)");
  auto* key_file = cmd->add_option("--api-key-file", o->api_key_file,
                                   "Require the key on this file's first line from clients");
  key->excludes(key_file);
  return {cmd, [o]() -> int { return RunServe(*o); }};
}

}  // namespace moetier::cli
