// HttpServer: cpp-httplib's routes onto ChatService. Each HTTP request runs on one of httplib's
// threads; its answer comes from the engine's thread through an Exchange (a queue and a condition
// variable), so the handlers never touch engine state and the engine never waits on a socket.
#include "server/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "server/anthropic_api.h"
#include "server/openai_api.h"
#include "server/peer_socket.h"
#include "server/residency_page.h"

namespace moetier::server {
namespace {

using Clock = std::chrono::steady_clock;
using httplib::DataSink;
using httplib::Request;
using httplib::Response;

// How often a handler waiting for its answer wakes to check that its client is still connected
// (a disconnect is noticed within this) and whether a ping is due.
constexpr std::chrono::milliseconds kPollInterval{100};
// Retry-After while the model loads: a load takes seconds to minutes, so a client polling faster
// only adds load.
constexpr int kRetryAfterLoadingSeconds = 5;
// Retry-After when the queue is full: requests finish every few seconds, so a second is enough
// to find room without hammering the server.
constexpr int kRetryAfterBusySeconds = 1;
// How long a browser may cache a CORS preflight answer (a day: the answer never changes).
constexpr int kCorsMaxAgeSeconds = 86400;
// How long Stop waits for the cancelled requests to be answered (a streamed one with its last
// event and [DONE]) before it closes the connections: a cancel takes effect at the engine's next
// step, and a step takes well under this.
constexpr std::chrono::milliseconds kStopDrainTimeout{10000};
// Length of the random part of response ids (96 bits: no collisions in a server's life).
constexpr int kIdHexDigits = 24;

enum class Api { kOpenAi, kAnthropic };

// The API a path belongs to, for the shape of its errors.
Api ApiOf(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? Api::kAnthropic : Api::kOpenAi;
}

void ReplyJson(Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void ReplyError(Response& res, Api api, const RequestError& error) {
  if (error.http_status == 503 && !res.has_header("Retry-After"))
    res.set_header("Retry-After", std::to_string(kRetryAfterBusySeconds));
  ReplyJson(res, error.http_status,
            api == Api::kAnthropic ? anthropic::ErrorBody(error) : openai::ErrorBody(error));
}

void ReplyError(Response& res, Api api, int http_status, std::string message) {
  RequestError error;
  error.http_status = http_status;
  error.message = std::move(message);
  ReplyError(res, api, error);
}

// A refusal as the parser or ChatService reported it, with the Status's message when the
// RequestError carries none.
RequestError Refusal(RequestError error, const Status& status) {
  if (error.message.empty()) error.message = status.message();
  if (error.http_status < 400) error.http_status = 400;
  return error;
}

int64_t UnixNow() {
  return static_cast<int64_t>(std::time(nullptr));
}

// Compares in time that depends on the key's length only, so that the time of a refusal does
// not tell a client how much of its guess was right.
bool SameKey(std::string_view given, std::string_view key) {
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const char g = i < given.size() ? given[i] : '\0';
    diff |= static_cast<unsigned char>(g ^ key[i]);
  }
  return diff == 0;
}

bool StartsWithIgnoreCase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  return true;
}

// Random ids for responses ("chatcmpl-…", "msg_…"). Thread-safe.
class IdMaker {
 public:
  std::string Next(std::string_view prefix) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string id(prefix);
    std::lock_guard lock(mu_);
    for (int i = 0; i < kIdHexDigits; ++i) id += kHex[rng_() % 16];
    return id;
  }

 private:
  std::mutex mu_;
  std::mt19937_64 rng_{std::random_device{}()};
};

// One request's answer on its way from the engine's thread (Push, inside the ChatSink) to the
// HTTP thread that sends it (Take). Shared by both; it lives as long as the longer of the two.
class Exchange {
 public:
  void Push(const ChatEvent& event) {
    {
      std::lock_guard lock(mu_);
      events_.push_back(event);
    }
    cv_.notify_one();
  }
  // The events that have come, waiting up to `timeout` for the first (none on a timeout).
  std::vector<ChatEvent> Take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<ChatEvent> out(std::make_move_iterator(events_.begin()),
                               std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChatEvent> events_;
};

// The requests in flight, so that Stop can cancel them. Thread-safe.
class InFlight {
 public:
  // A request started on `service`; cancelled at once when the server is stopping.
  void Add(ChatService& service, RequestId id) {
    std::lock_guard lock(mu_);
    if (stopping_) {
      service.Cancel(id);
      return;
    }
    requests_[id] = &service;
  }
  void Remove(RequestId id) {
    {
      std::lock_guard lock(mu_);
      requests_.erase(id);
    }
    emptied_.notify_all();
  }
  // Cancels every request in flight, and every later one as it is added.
  void CancelAll() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (const auto& [id, service] : requests_) service->Cancel(id);
  }
  // Waits until every request has been answered, or `timeout` has passed.
  void WaitEmpty(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    emptied_.wait_for(lock, timeout, [&] { return requests_.empty(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable emptied_;
  std::map<RequestId, ChatService*> requests_;
  bool stopping_ = false;
};

std::string StreamText(openai::ResponseWriter& writer, const ChatEvent& event) {
  return writer.Chunk(event);
}
std::string StreamText(anthropic::ResponseWriter& writer, const ChatEvent& event) {
  return writer.Events(event);
}

// A streamed answer: httplib calls Pump on the request's thread until the answer is done or the
// client is gone, then Release (whether or not it was all sent).
template <class Writer>
class EventStream {
 public:
  EventStream(Writer writer, std::shared_ptr<Exchange> exchange, ChatService& service, RequestId id,
              InFlight& in_flight, std::chrono::milliseconds ping_interval)
      : writer_(std::move(writer)),
        exchange_(std::move(exchange)),
        service_(service),
        id_(id),
        in_flight_(in_flight),
        ping_interval_(ping_interval),
        last_sent_(Clock::now()) {}

  // Sends what has come, or a ping when nothing has for ping_interval; false ends the response
  // (the client is gone: the request is cancelled).
  bool Pump(DataSink& sink) {
    const std::vector<ChatEvent> events = exchange_->Take(std::min(kPollInterval, ping_interval_));
    for (const ChatEvent& e : events) {
      if (!Send(sink, StreamText(writer_, e))) return false;
      if (e.kind == ChatEvent::Kind::kFinished) {
        finished_ = true;
        sink.done();
        return true;
      }
    }
    if (!events.empty()) return true;
    if (Clock::now() - last_sent_ >= ping_interval_) return Send(sink, ": ping\n\n");
    if (!sink.is_writable()) {
      Abandon();
      return false;
    }
    return true;
  }

  // The response is over: a request that has not finished (the client left, or the server is
  // stopping) is cancelled.
  void Release() {
    if (!finished_) Abandon();
    in_flight_.Remove(id_);
  }

 private:
  bool Send(DataSink& sink, const std::string& text) {
    if (text.empty()) return true;
    if (!sink.is_writable() || !sink.write(text.data(), text.size())) {
      Abandon();
      return false;
    }
    last_sent_ = Clock::now();
    return true;
  }
  void Abandon() {
    if (cancelled_) return;
    cancelled_ = true;
    service_.Cancel(id_);
  }

  Writer writer_;
  std::shared_ptr<Exchange> exchange_;
  ChatService& service_;
  RequestId id_;
  InFlight& in_flight_;
  std::chrono::milliseconds ping_interval_;
  Clock::time_point last_sent_;
  bool finished_ = false;
  bool cancelled_ = false;
};

// A whole (non-streamed) answer: waits for kFinished, then replies. The engine ends every
// request with kFinished, so this returns once it has (Stop cancels what is in flight). A client
// that hangs up meanwhile cancels the request at once (its answer then goes nowhere).
template <class Writer>
void ReplyWhole(Writer& writer, Exchange& exchange, Api api, Response& res, PeerSocket& peer,
                ChatService& service, RequestId id) {
  bool cancelled = false;
  for (;;) {
    if (!cancelled && peer.Closed()) {
      service.Cancel(id);
      cancelled = true;
    }
    for (const ChatEvent& e : exchange.Take(kPollInterval)) {
      writer.Add(e);
      if (e.kind != ChatEvent::Kind::kFinished) continue;
      if (e.finish_reason == FinishReason::kError)
        return ReplyError(res, api, 500, "generation failed: " + e.error);
      if (e.finish_reason == FinishReason::kCancelled)
        return ReplyError(res, api, 503, "the server is shutting down; retry the request");
      return ReplyJson(res, 200, writer.Body());
    }
  }
}

// Reads the request body, at most `max_bytes`; replies 413 or 400 and returns false otherwise.
bool ReadBody(const httplib::ContentReader& reader, size_t max_bytes, Api api, Response& res,
              std::string& body) {
  bool too_large = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (body.size() + n > max_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (read) return true;
  // httplib sets 413 itself when Content-Length alone is over the limit.
  if (too_large || res.status == 413) {
    ReplyError(res, api, 413,
               "the request body is larger than this server's limit of " +
                   std::to_string(max_bytes) + " bytes; send a shorter conversation");
  } else {
    ReplyError(res, api, 400, "the request body could not be read (a broken chunked encoding?)");
  }
  return false;
}

// The Prometheus text exposition of the service's counters.
// The model's own figures: where its expert bytes are, and what the expert executors did
// (--moe-collect-stats is always on under serve).
void ModelMetrics(const CausalLM& model, std::ostringstream& out) {
  const ResidencyReport& r = model.residency();
  const auto& layers = r.settled ? *r.settled : r.plan.layers;
  out << "# HELP moetier_expert_bytes Expert bank bytes by tier (settled at load).\n"
         "# TYPE moetier_expert_bytes gauge\n";
  for (Tier t : {Tier::kGpu, Tier::kPinned, Tier::kLocked, Tier::kPageable}) {
    uint64_t bytes = 0;
    for (const LayerResidency& l : layers) bytes += l.tier == t ? l.bytes : 0;
    out << "moetier_expert_bytes{tier=\"" << TierName(t) << "\"} " << bytes << '\n';
  }
  if (model.expert_stats() == nullptr) return;
  LayerExpertStats t;
  for (const LayerExpertStats& l : model.expert_stats()->Snapshot()) t += l;
  auto put = [&out](const char* name, const char* help, int64_t value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " counter\n"
        << name << ' ' << value << '\n';
  };
  put("moetier_experts_run_on_cpu_total", "Experts computed by the CPU executor, over layers.",
      t.cpu_experts);
  put("moetier_experts_run_on_gpu_total", "Experts computed on the GPU, over layers.",
      t.gpu_experts);
  put("moetier_expert_cache_hits_total", "GPU expert cache hits.", t.cache_hits);
  put("moetier_expert_cache_misses_total",
      "GPU expert cache misses (fetched, or with hybrid computed by the CPU).", t.cache_misses);
  put("moetier_experts_fetched_total", "Experts copied host to device.", t.fetched_experts);
  put("moetier_expert_bytes_to_gpu_total", "Expert bytes copied host to device.", t.bytes_h2d);
  out << "# HELP moetier_expert_copy_seconds_total Copy-engine time on the expert copies.\n"
         "# TYPE moetier_expert_copy_seconds_total counter\n"
      << "moetier_expert_copy_seconds_total " << static_cast<double>(t.h2d_ns) / 1e9 << '\n';
  const int64_t lookups = t.cache_hits + t.cache_misses;
  out << "# HELP moetier_expert_cache_hit_ratio Hits over lookups of the GPU expert cache.\n"
         "# TYPE moetier_expert_cache_hit_ratio gauge\n"
      << "moetier_expert_cache_hit_ratio "
      << (lookups > 0 ? static_cast<double>(t.cache_hits) / static_cast<double>(lookups) : 0.0)
      << '\n';
}

std::string MetricsText(const ServiceMetrics& m, const CausalLM& model) {
  std::ostringstream out;
  auto put = [&out](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
        << name << ' ' << value << '\n';
  };
  put("moetier_requests_running", "gauge", "Requests being generated.", m.requests_running);
  put("moetier_requests_waiting", "gauge", "Requests queued for a free sequence.",
      m.requests_waiting);
  put("moetier_requests_total", "counter", "Requests accepted.", m.requests_total);
  put("moetier_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
      m.prompt_tokens_total);
  put("moetier_prefix_cache_hit_tokens_total", "counter",
      "Prompt tokens whose K/V came from the prefix cache.", m.cached_prompt_tokens_total);
  put("moetier_generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens_total);
  put("moetier_prompt_seconds_total", "counter",
      "Seconds from arrival to the first token (queue and prefill), summed over requests.",
      m.prompt_seconds_total);
  put("moetier_generation_seconds_total", "counter",
      "Seconds after the first token until the end, summed over requests.",
      m.generation_seconds_total);
  const int64_t finished =
      std::max<int64_t>(0, m.requests_total - m.requests_running - m.requests_waiting);
  out << "# HELP moetier_time_to_first_token_seconds Time to first token of finished requests.\n"
         "# TYPE moetier_time_to_first_token_seconds summary\n"
      << "moetier_time_to_first_token_seconds_sum " << m.prompt_seconds_total << '\n'
      << "moetier_time_to_first_token_seconds_count " << finished << '\n';
  put("moetier_kv_blocks_used", "gauge", "KV cache blocks in use.", m.kv_blocks_used);
  put("moetier_kv_blocks_total", "gauge", "KV cache blocks in the pool.", m.kv_blocks_total);
  put("moetier_kv_blocks_touched", "gauge",
      "KV cache blocks ever used (a host pool's resident memory grows until all have been).",
      m.kv_blocks_touched);
  put("moetier_kv_host_blocks", "gauge",
      "KV cache blocks held by the host tier (--kv-host-gb) for a later prefix match.",
      m.kv_host_blocks_held);
  put("moetier_kv_host_blocks_total", "gauge", "The host KV tier's capacity in blocks.",
      m.kv_host_blocks_total);
  put("moetier_kv_host_restored_tokens_total", "counter",
      "Prompt tokens whose K/V the host tier gave back instead of their recomputation.",
      m.kv_host_restored_tokens);
  put("moetier_kv_cache_usage_ratio", "gauge", "Share of the KV cache in use (0 to 1).",
      m.kv_blocks_total > 0
          ? static_cast<double>(m.kv_blocks_used) / static_cast<double>(m.kv_blocks_total)
          : 0.0);
  ModelMetrics(model, out);
  return out.str();
}

// Every route, for the error that names them when a client asks for another.
constexpr const char* kRouteList =
    "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /v1/messages, POST "
    "/v1/messages/count_tokens, GET /health, GET /metrics, GET /residency, GET /v1/residency";

// The method a known path takes, or null for an unknown path.
const char* MethodOf(const std::string& path) {
  static const std::map<std::string, const char*> kMethods = {{"/v1/chat/completions", "POST"},
                                                              {"/v1/completions", "POST"},
                                                              {"/v1/messages", "POST"},
                                                              {"/v1/messages/count_tokens", "POST"},
                                                              {"/v1/models", "GET"},
                                                              {"/health", "GET"},
                                                              {"/metrics", "GET"},
                                                              {"/residency", "GET"},
                                                              {"/v1/residency", "GET"}};
  const auto it = kMethods.find(path);
  return it == kMethods.end() ? nullptr : it->second;
}

// The name answers carry: the client's, as OpenAI and Anthropic echo it, else the served model's.
std::string ModelName(const ChatRequest& request, const ChatService& s) {
  return request.model.empty() ? s.model_name() : request.model;
}

}  // namespace

struct HttpServer::Impl {
  Impl(ChatService* service_or_null, ServerOptions server_options)
      : options(std::move(server_options)), service(service_or_null) {
    InstallRoutes();
  }

  void InstallRoutes();
  // A POST route: `route` gets the request, its body (read within the size limit) and the
  // service (the key checked, the model loaded).
  void InstallPost(
      const std::string& path, Api api,
      std::function<void(const Request&, const std::string&, Response&, ChatService&)> route);
  void InstallErrorHandlers();
  // The service, when the key is right and the model loaded; otherwise replies 401 or 503.
  ChatService* Admit(const Request& req, Response& res, Api api);
  bool Authorized(const Request& req) const;

  void Health(Response& res) const;
  void Models(Response& res, const ChatService& s, const std::string* only) const;
  void OpenAiAnswer(const Request& req, openai::Endpoint endpoint, const std::string& body,
                    Response& res, ChatService& s);
  void AnthropicAnswer(const Request& req, const std::string& body, Response& res, ChatService& s);
  void CountTokens(const std::string& body, Response& res, ChatService& s);
  template <class Writer>
  void Answer(const Request& req, Api api, Writer writer, const ChatRequest& request, bool stream,
              Response& res, ChatService& s);

  ServerOptions options;
  httplib::Server http;
  std::atomic<ChatService*> service;
  std::atomic<double> load_progress{0.0};
  InFlight in_flight;
  IdMaker ids;
  const int64_t created = UnixNow();
  const Clock::time_point started = Clock::now();  // uptime for /v1/residency's rates
  std::atomic<int> port{0};

  // Bind, Listen and Stop, which may run on different threads.
  std::mutex mu;
  bool bound = false;
  bool listening = false;
  bool listen_returned = false;
  bool stop_requested = false;
};

void HttpServer::Impl::InstallRoutes() {
  const int n_threads = std::max(1, options.n_http_threads);
  http.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
  http.set_payload_max_length(options.max_body_bytes);
  // CORS on every response: the API is meant for browser front ends on other origins too, and
  // the key (not the origin) is what guards it.
  http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  http.Options(".*", [](const Request& req, Response& res) {
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header(
        "Access-Control-Allow-Headers",
        asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked);
    res.set_header("Access-Control-Max-Age", std::to_string(kCorsMaxAgeSeconds));
  });
  http.Get("/health", [this](const Request&, Response& res) { Health(res); });
  http.Get("/metrics", [this](const Request& req, Response& res) {
    if (ChatService* s = Admit(req, res, Api::kOpenAi))
      res.set_content(MetricsText(s->Metrics(), s->model()), "text/plain; version=0.0.4");
  });
  // The page holds no data (it fetches /v1/residency with the key), so it is open: a browser
  // cannot send a header when it loads a page.
  http.Get("/residency", [](const Request&, Response& res) {
    res.set_content(ResidencyPageHtml(), "text/html; charset=utf-8");
  });
  http.Get("/v1/residency", [this](const Request& req, Response& res) {
    if (ChatService* s = Admit(req, res, Api::kOpenAi)) {
      const double uptime = std::chrono::duration<double>(Clock::now() - started).count();
      // Names and warnings come from file names, which need not be UTF-8.
      res.set_content(ResidencyJson(s->model(), s->Metrics(), uptime)
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      "application/json");
    }
  });
  http.Get("/v1/models", [this](const Request& req, Response& res) {
    if (ChatService* s = Admit(req, res, Api::kOpenAi)) Models(res, *s, nullptr);
  });
  http.Get(R"(/v1/models/(.+))", [this](const Request& req, Response& res) {
    const std::string name = req.matches[1];
    if (ChatService* s = Admit(req, res, Api::kOpenAi)) Models(res, *s, &name);
  });
  InstallPost("/v1/chat/completions", Api::kOpenAi,
              [this](const Request& req, const std::string& body, Response& res, ChatService& s) {
                OpenAiAnswer(req, openai::Endpoint::kChatCompletions, body, res, s);
              });
  InstallPost("/v1/completions", Api::kOpenAi,
              [this](const Request& req, const std::string& body, Response& res, ChatService& s) {
                OpenAiAnswer(req, openai::Endpoint::kCompletions, body, res, s);
              });
  InstallPost("/v1/messages", Api::kAnthropic,
              [this](const Request& req, const std::string& body, Response& res, ChatService& s) {
                AnthropicAnswer(req, body, res, s);
              });
  InstallPost("/v1/messages/count_tokens", Api::kAnthropic,
              [this](const Request&, const std::string& body, Response& res, ChatService& s) {
                CountTokens(body, res, s);
              });
  InstallErrorHandlers();
}

// The body is read before the key is checked: an unread body would be taken for the next
// request on a kept-alive connection.
void HttpServer::Impl::InstallPost(
    const std::string& path, Api api,
    std::function<void(const Request&, const std::string&, Response&, ChatService&)> route) {
  http.Post(path, [this, api, route = std::move(route)](const Request& req, Response& res,
                                                        const httplib::ContentReader& reader) {
    std::string body;
    if (!ReadBody(reader, options.max_body_bytes, api, res, body)) return;
    if (ChatService* s = Admit(req, res, api)) route(req, body, res, *s);
  });
}

// Errors httplib produces itself (no route, a malformed request, a handler that threw), in the
// shape of the API the path belongs to.
void HttpServer::Impl::InstallErrorHandlers() {
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req,
                                                                 Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a route's own
    const Api api = ApiOf(req.path);
    if (res.status == 404) {
      if (const char* method = MethodOf(req.path)) {
        res.set_header("Allow", method);
        ReplyError(res, api, 405, req.path + " takes " + method + ", not " + req.method);
      } else {
        ReplyError(res, api, 404,
                   "no route " + req.method + " " + req.path + "; the routes are " + kRouteList);
      }
    } else if (res.status == 413) {
      ReplyError(res, api, 413, "the request body is larger than this server's limit");
    } else if (res.status == 400) {
      ReplyError(res, api, 400, "malformed HTTP request (request line or headers)");
    } else {
      ReplyError(res, api, res.status, "HTTP error " + std::to_string(res.status));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const Request& req, Response& res, const std::exception_ptr& ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    ReplyError(res, ApiOf(req.path), 500,
               "internal error: " + what + " (please report it with the request)");
  });
}

bool HttpServer::Impl::Authorized(const Request& req) const {
  const std::string& key = options.api_key;
  if (key.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  bool ok = false;
  const std::string auth = req.get_header_value("Authorization");
  if (StartsWithIgnoreCase(auth, kBearer))
    ok |= SameKey(std::string_view(auth).substr(kBearer.size()), key);
  if (req.has_header("x-api-key")) ok |= SameKey(req.get_header_value("x-api-key"), key);
  return ok;
}

ChatService* HttpServer::Impl::Admit(const Request& req, Response& res, Api api) {
  if (!Authorized(req)) {
    res.set_header("WWW-Authenticate", "Bearer");
    ReplyError(res, api, 401,
               "missing or wrong API key: send the server's key as 'Authorization: Bearer KEY' "
               "or 'x-api-key: KEY'");
    return nullptr;
  }
  ChatService* s = service.load();
  if (s == nullptr) {
    res.set_header("Retry-After", std::to_string(kRetryAfterLoadingSeconds));
    ReplyError(res, api, 503, "the model is still loading; retry shortly (GET /health says when)");
  }
  return s;
}

void HttpServer::Impl::Health(Response& res) const {
  if (service.load() != nullptr) return ReplyJson(res, 200, R"({"status":"ok"})");
  res.set_header("Retry-After", std::to_string(kRetryAfterLoadingSeconds));
  const nlohmann::json body = {{"status", "loading"}, {"progress", load_progress.load()}};
  ReplyJson(res, 503, body.dump());
}

void HttpServer::Impl::Models(Response& res, const ChatService& s, const std::string* only) const {
  const nlohmann::json model = {
      {"id", s.model_name()}, {"object", "model"}, {"created", created}, {"owned_by", "moetier"}};
  if (only == nullptr) {
    return ReplyJson(
        res, 200,
        nlohmann::json{{"object", "list"}, {"data", nlohmann::json::array({model})}}.dump(
            -1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (*only == s.model_name())
    return ReplyJson(res, 200,
                     model.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  ReplyError(
      res, Api::kOpenAi, 404,
      "no model '" + *only + "'; this server serves '" + s.model_name() + "' (GET /v1/models)");
}

void HttpServer::Impl::OpenAiAnswer(const Request& req, openai::Endpoint endpoint,
                                    const std::string& body, Response& res, ChatService& s) {
  RequestError error;
  auto parsed = openai::ParseRequest(endpoint, body, &error);
  if (!parsed.ok()) return ReplyError(res, Api::kOpenAi, Refusal(error, parsed.status()));
  const bool chat = endpoint == openai::Endpoint::kChatCompletions;
  openai::ResponseWriter writer(endpoint, ids.Next(chat ? "chatcmpl-" : "cmpl-"),
                                ModelName(parsed->request, s), UnixNow(), parsed->include_usage,
                                parsed->request.top_logprobs >= 0);
  Answer(req, Api::kOpenAi, std::move(writer), parsed->request, parsed->stream, res, s);
}

void HttpServer::Impl::AnthropicAnswer(const Request& req, const std::string& body, Response& res,
                                       ChatService& s) {
  RequestError error;
  auto parsed = anthropic::ParseRequest(body, /*count_tokens=*/false, &error);
  if (!parsed.ok()) return ReplyError(res, Api::kAnthropic, Refusal(error, parsed.status()));
  anthropic::ResponseWriter writer(ids.Next("msg_"), ModelName(parsed->request, s));
  Answer(req, Api::kAnthropic, std::move(writer), parsed->request, parsed->stream, res, s);
}

void HttpServer::Impl::CountTokens(const std::string& body, Response& res, ChatService& s) {
  RequestError error;
  auto parsed = anthropic::ParseRequest(body, /*count_tokens=*/true, &error);
  if (!parsed.ok()) return ReplyError(res, Api::kAnthropic, Refusal(error, parsed.status()));
  auto n = s.CountPromptTokens(parsed->request);
  if (!n.ok()) return ReplyError(res, Api::kAnthropic, 400, n.message());
  ReplyJson(res, 200, nlohmann::json{{"input_tokens", *n}}.dump());
}

// Starts the request; answers as a whole, or streams it through httplib's chunked content
// provider (which runs on this request's thread after this handler returns).
template <class Writer>
void HttpServer::Impl::Answer(const Request& req, Api api, Writer writer,
                              const ChatRequest& request, bool stream, Response& res,
                              ChatService& s) {
  auto exchange = std::make_shared<Exchange>();
  RequestError error;
  auto id = s.Start(
      request, [exchange](const ChatEvent& e) { exchange->Push(e); }, &error);
  if (!id.ok()) return ReplyError(res, api, Refusal(error, id.status()));
  in_flight.Add(s, *id);
  if (!stream) {
    PeerSocket peer(req.remote_addr, req.remote_port, req.local_port);
    ReplyWhole(writer, *exchange, api, res, peer, s, *id);
    in_flight.Remove(*id);
    return;
  }
  auto events = std::make_shared<EventStream<Writer>>(std::move(writer), exchange, s, *id,
                                                      in_flight, options.ping_interval);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // nginx in front: pass each event on at once
  res.set_chunked_content_provider(
      "text/event-stream", [events](size_t, DataSink& sink) { return events->Pump(sink); },
      [events](bool) { events->Release(); });
}

HttpServer::HttpServer(ChatService& service, ServerOptions options)
    : impl_(std::make_unique<Impl>(&service, std::move(options))) {}

HttpServer::HttpServer(ServerOptions options)
    : impl_(std::make_unique<Impl>(nullptr, std::move(options))) {}

HttpServer::~HttpServer() {
  Stop();
}

Status HttpServer::Bind() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (m.bound) return OkStatus();
  const std::string& host = m.options.host;
  int port = -1;
  errno = 0;
  if (m.options.port == 0) {
    port = m.http.bind_to_any_port(host);
  } else if (m.http.bind_to_port(host, m.options.port)) {
    port = m.options.port;
  }
  if (port <= 0) {
    const std::string why = errno != 0 ? std::strerror(errno) : "no such address";
    return Status::Error(host + ":" + std::to_string(m.options.port) + ": cannot listen there (" +
                         why +
                         "); choose another --port, or a --host that is an address of "
                         "this machine");
  }
  m.bound = true;
  m.port = port;
  return OkStatus();
}

Status HttpServer::Listen() {
  MT_RETURN_IF_ERROR(Bind());
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    if (m.stop_requested) return OkStatus();
    m.listening = true;
  }
  const bool ok = m.http.listen_after_bind();
  {
    std::lock_guard lock(m.mu);
    m.listen_returned = true;
  }
  if (!ok)
    return Status::Error(m.options.host + ":" + std::to_string(m.port.load()) +
                         ": the listening socket failed; restart the server");
  return OkStatus();
}

void HttpServer::Stop() {
  Impl& m = *impl_;
  bool listening = false;
  {
    std::lock_guard lock(m.mu);
    m.stop_requested = true;
    listening = m.listening && !m.listen_returned;
  }
  m.in_flight.CancelAll();
  if (!listening) return;
  m.in_flight.WaitEmpty(kStopDrainTimeout);
  // Listen may not have reached httplib's loop yet, and httplib's stop() does nothing before
  // then: wait for it (or for Listen to have ended), so that the stop is not lost.
  for (;;) {
    {
      std::lock_guard lock(m.mu);
      if (m.listen_returned) return;
    }
    if (m.http.is_running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  m.http.stop();
}

void HttpServer::SetLoadProgress(double fraction) {
  impl_->load_progress = std::clamp(fraction, 0.0, 1.0);
}

void HttpServer::SetService(ChatService& service) {
  impl_->service = &service;
}

int HttpServer::port() const {
  return impl_->port;
}

}  // namespace moetier::server
