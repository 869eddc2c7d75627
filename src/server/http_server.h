// `moetier serve`'s HTTP side (cpp-httplib): the routes of the OpenAI API (/v1/chat/completions,
// /v1/completions, /v1/models), of the Anthropic API (/v1/messages, /v1/messages/count_tokens),
// /health, /metrics (Prometheus text) and the residency page, with what every route shares:
// the API key (Authorization: Bearer or x-api-key, compared in constant time; /health is open),
// CORS (preflight answered), a body size limit (413), JSON errors in each API's shape, SSE
// streaming with ": ping" comments while a long prompt is prefilled, and a client that
// disconnects cancelling its request at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/chat_service.h"

namespace moetier::server {

// A streamed answer with nothing new for this long gets an SSE comment (": ping"): proxies and
// clients drop a connection silent for tens of seconds, and a long prefill is silent.
inline constexpr std::chrono::milliseconds kDefaultPingInterval{3000};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (the one chosen is printed and returned by port())
  std::string api_key;  // empty: no key needed
  size_t max_body_bytes = 16 << 20;
  int n_http_threads = 8;  // connections served at once (a streamed answer holds one)
  std::chrono::milliseconds ping_interval = kDefaultPingInterval;
};

class HttpServer {
 public:
  HttpServer(ChatService& service, ServerOptions options);
  // A server whose model is still loading (bind first, then load): /health answers 503
  // {"status": "loading", "progress": p} and every other route 503 with Retry-After, in its
  // API's shape, until SetService.
  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  // Binds (an error names the host and port); Listen binds when this was not called.
  Status Bind();
  // Serves on this thread until Stop().
  Status Listen();
  // Thread-safe; cancels the requests in flight (their handlers end once the engine says so,
  // so the engine must still run) and Listen returns.
  void Stop();
  // Thread-safe: the share of the load done, in [0, 1], for /health while loading.
  void SetLoadProgress(double fraction);
  // Thread-safe: the routes serve `service` from now on; it must outlive the server.
  void SetService(ChatService& service);
  // The bound port, once bound (0 before).
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moetier::server
