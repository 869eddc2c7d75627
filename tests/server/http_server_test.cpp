// The HTTP server through a real client (httplib::Client) on the loopback interface, on the
// realvocab Qwen3 fixture (its real tokenizer and chat template, tiny random weights: answers are
// gibberish but deterministic when greedy): every route, the API key, CORS, the body limit,
// errors in each API's shape, SSE streaming, a client that leaves mid-stream, concurrency, and
// the loading state.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/chat_service.h"
#include "support/test_support.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::server {
namespace {

using nlohmann::json;

constexpr const char* kHost = "127.0.0.1";
constexpr const char* kKey = "test-key-0123";
// Room for a long answer (the disconnect test) beside the concurrent ones.
constexpr int64_t kKvPositions = 16384;
constexpr int kParallel = 4;
// Small, so that the 413 test sends little.
constexpr size_t kMaxBodyBytes = 64 << 10;
// Generous: a loaded CI machine runs the model slowly, and a timeout here is not what is tested.
constexpr time_t kClientTimeoutSeconds = 120;

// A server listening on a thread of its own; stopped and joined when destroyed.
class RunningServer {
 public:
  RunningServer(ChatService* service, ServerOptions options) {
    options.host = kHost;
    options.port = 0;
    server_ = service != nullptr ? std::make_unique<HttpServer>(*service, options)
                                 : std::make_unique<HttpServer>(options);
    const Status bound = server_->Bind();
    EXPECT_TRUE(bound.ok()) << bound.message();
    thread_ = std::thread([this] { listen_status_ = server_->Listen(); });
  }
  ~RunningServer() {
    server_->Stop();
    thread_.join();
    EXPECT_TRUE(listen_status_.ok()) << listen_status_.message();
  }
  HttpServer& server() { return *server_; }
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  Status listen_status_;
};

// The fixture model, its engine (on its own thread) and the service, shared by every test.
struct World {
  World() {
    const auto dir = testing::HfFixture("realvocab/qwen3_moe_tiny");
    auto m = LoadCausalLM(dir, testing::WithThreads(1));
    EXPECT_TRUE(m.ok()) << m.message();
    model = std::move(*m);
    model->CollectExpertStats();  // as `moetier serve` does
    auto t = text::Tokenizer::Load(dir);
    EXPECT_TRUE(t.ok()) << t.message();
    tokenizer.emplace(std::move(*t));
    auto c = text::ChatTemplate::Load(dir);
    EXPECT_TRUE(c.ok()) << c.message();
    chat.emplace(std::move(*c));
    engine = testing::MakeEngine(*model, kKvPositions, &*tokenizer, kParallel);
    service = std::make_unique<ChatService>(*model, *engine, *tokenizer, &*chat);
    engine->Start();
    ServerOptions options;
    options.api_key = kKey;
    options.max_body_bytes = kMaxBodyBytes;
    server = std::make_unique<RunningServer>(service.get(), options);
  }
  ~World() {
    server.reset();
    engine->Stop();
  }

  std::unique_ptr<CausalLM> model;
  std::optional<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ChatService> service;
  std::unique_ptr<RunningServer> server;
};

World* world = nullptr;

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { world = new World(); }
  static void TearDownTestSuite() {
    delete world;
    world = nullptr;
  }

  // A client of the shared server, with the key unless told otherwise.
  static std::unique_ptr<httplib::Client> Client(bool with_key = true, int port = 0) {
    auto cli = std::make_unique<httplib::Client>(kHost, port != 0 ? port : world->server->port());
    cli->set_read_timeout(kClientTimeoutSeconds, 0);
    if (with_key) cli->set_bearer_token_auth(kKey);
    return cli;
  }
};

json ChatBody(const std::string& user, int64_t max_tokens, bool stream = false) {
  json body = {{"model", "tiny"},
               {"messages", json::array({{{"role", "user"}, {"content", user}}})},
               {"max_tokens", max_tokens},
               {"temperature", 0}};
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

// POSTs `body` and returns the response's body as it came, with its status; the receiver may
// end the read early (returning false), as a client that leaves does.
struct Streamed {
  int status = 0;
  std::string text;
  httplib::Error error = httplib::Error::Success;
};
Streamed PostStreaming(httplib::Client& cli, const std::string& path, const std::string& body,
                       std::function<bool(const std::string& so_far)> keep_reading = nullptr) {
  Streamed out;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.text.append(data, n);
    return !keep_reading || keep_reading(out.text);
  };
  auto res = cli.send(req);
  out.error = res.error();
  return out;
}

// The payloads of an SSE stream's "data:" lines, in order (comments and event names dropped).
std::vector<std::string> DataLines(const std::string& sse) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    size_t end = sse.find('\n', pos);
    if (end == std::string::npos) end = sse.size();
    const std::string line = sse.substr(pos, end - pos);
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
    pos = end + 1;
  }
  return out;
}

// Waits until nothing runs or waits in the service (a cancelled request has ended).
bool WaitIdle(std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const ServiceMetrics m = world->service->Metrics();
    if (m.requests_running == 0 && m.requests_waiting == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_F(HttpServerTest, HealthIsOpenAndOk) {
  auto res = Client(/*with_key=*/false)->Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body), json({{"status", "ok"}}));
}

TEST_F(HttpServerTest, ModelsListsTheServedModel) {
  auto res = Client()->Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], world->service->model_name());
  EXPECT_EQ(body["data"][0]["object"], "model");
}

TEST_F(HttpServerTest, ApiKeyIsRequiredOnEveryRouteButHealth) {
  auto none = Client(/*with_key=*/false);
  auto missing = none->Get("/v1/models");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(json::parse(missing->body)["error"]["type"], "authentication_error");

  auto wrong = Client(/*with_key=*/false);
  wrong->set_bearer_token_auth("test-key-0124");
  auto refused = wrong->Post("/v1/chat/completions", ChatBody("Hi", 2).dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);

  // A prefix of the key is not the key.
  auto prefix = Client(/*with_key=*/false);
  prefix->set_bearer_token_auth("test-key");
  auto short_key = prefix->Get("/metrics");
  ASSERT_TRUE(short_key);
  EXPECT_EQ(short_key->status, 401);

  auto messages =
      none->Post("/v1/messages", R"({"max_tokens":2,"messages":[]})", "application/json");
  ASSERT_TRUE(messages);
  EXPECT_EQ(messages->status, 401);
  const json anthropic_error = json::parse(messages->body);
  EXPECT_EQ(anthropic_error["type"], "error");
  EXPECT_EQ(anthropic_error["error"]["type"], "authentication_error");

  auto x_api_key = none->Get("/v1/models", {{"x-api-key", kKey}});
  ASSERT_TRUE(x_api_key);
  EXPECT_EQ(x_api_key->status, 200);
  auto bearer = Client()->Get("/v1/models");
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200);
}

TEST_F(HttpServerTest, CorsPreflightIsAnsweredWithoutKey) {
  auto cli = Client(/*with_key=*/false);
  auto res = cli->Options("/v1/chat/completions",
                          {{"Origin", "http://example.test"},
                           {"Access-Control-Request-Method", "POST"},
                           {"Access-Control-Request-Headers", "authorization, content-type"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 204);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Headers").find("authorization"),
            std::string::npos);
  // Every response carries it, errors included.
  auto error = cli->Get("/v1/models");
  ASSERT_TRUE(error);
  EXPECT_EQ(error->get_header_value("Access-Control-Allow-Origin"), "*");
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413InEachShape) {
  const std::string big(kMaxBodyBytes + 1, ' ');
  auto cli = Client();
  auto openai = cli->Post("/v1/chat/completions", big, "application/json");
  ASSERT_TRUE(openai);
  EXPECT_EQ(openai->status, 413);
  EXPECT_TRUE(json::parse(openai->body)["error"].contains("message"));
  auto anthropic = cli->Post("/v1/messages", big, "application/json");
  ASSERT_TRUE(anthropic);
  EXPECT_EQ(anthropic->status, 413);
  EXPECT_EQ(json::parse(anthropic->body)["type"], "error");
  // The connection (or a new one) still serves.
  auto after = cli->Get("/v1/models");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

TEST_F(HttpServerTest, MalformedJsonIs400InEachShape) {
  auto cli = Client();
  for (const std::string path : {"/v1/chat/completions", "/v1/completions"}) {
    auto res = cli->Post(path, "{\"messages\": [", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << path;
    const json body = json::parse(res->body);
    EXPECT_EQ(body["error"]["type"], "invalid_request_error") << path;
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
  }
  for (const std::string path : {"/v1/messages", "/v1/messages/count_tokens"}) {
    auto res = cli->Post(path, "\xff\xfe not json", "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << path;
    const json body = json::parse(res->body);
    EXPECT_EQ(body["type"], "error") << path;
    EXPECT_EQ(body["error"]["type"], "invalid_request_error") << path;
  }
}

TEST_F(HttpServerTest, UnknownRouteAndWrongMethodNameTheRoutes) {
  auto cli = Client();
  auto unknown = cli->Get("/v1/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_NE(json::parse(unknown->body)["error"]["message"].get<std::string>().find(
                "/v1/chat/completions"),
            std::string::npos);
  auto wrong_method = cli->Get("/v1/chat/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "POST");
}

TEST_F(HttpServerTest, ChatCompletionAnswersAsAWhole) {
  auto res =
      Client()->Post("/v1/chat/completions", ChatBody("Hello", 6).dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(body["usage"]["prompt_tokens"].get<int64_t>(), 0);
  EXPECT_LE(body["usage"]["completion_tokens"].get<int64_t>(), 6);
}

// Streamed deltas add up to the whole answer, the first carries the role, usage comes last,
// then [DONE].
TEST_F(HttpServerTest, StreamingChunksEndWithDoneAndMatchTheWholeAnswer) {
  auto cli = Client();
  auto whole =
      cli->Post("/v1/chat/completions", ChatBody("Tell me", 12).dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json message = json::parse(whole->body)["choices"][0]["message"];
  const std::string expected =
      message.value("reasoning_content", std::string()) + message["content"].get<std::string>();

  const Streamed s =
      PostStreaming(*cli, "/v1/chat/completions", ChatBody("Tell me", 12, true).dump());
  ASSERT_EQ(s.status, 200) << s.text;
  const std::vector<std::string> data = DataLines(s.text);
  ASSERT_GE(data.size(), 3u) << s.text;
  EXPECT_EQ(data.back(), "[DONE]");
  const json first = json::parse(data.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  const json usage_chunk = json::parse(data[data.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_GT(usage_chunk["usage"]["prompt_tokens"].get<int64_t>(), 0);
  std::string streamed;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json chunk = json::parse(data[i]);
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string())
      streamed += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content") && delta["content"].is_string())
      streamed += delta["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, expected);
}

TEST_F(HttpServerTest, CompletionsAnswerATextPromptStreamedOrNot) {
  auto cli = Client();
  const json body = {{"prompt", "The capital of"}, {"max_tokens", 5}, {"temperature", 0}};
  auto whole = cli->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json answer = json::parse(whole->body);
  EXPECT_EQ(answer["object"], "text_completion");
  EXPECT_TRUE(answer["choices"][0]["text"].is_string());

  json streaming = body;
  streaming["stream"] = true;
  const Streamed s = PostStreaming(*cli, "/v1/completions", streaming.dump());
  ASSERT_EQ(s.status, 200);
  const std::vector<std::string> data = DataLines(s.text);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json chunk = json::parse(data[i]);
    if (!chunk["choices"].empty()) text += chunk["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, answer["choices"][0]["text"].get<std::string>());
}

TEST_F(HttpServerTest, MessagesAndCountTokens) {
  auto cli = Client();
  const json body = {{"model", "tiny"},
                     {"max_tokens", 5},
                     {"temperature", 0},
                     {"messages", json::array({{{"role", "user"}, {"content", "Hi there"}}})}};
  auto res = cli->Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json message = json::parse(res->body);
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["id"].get<std::string>().rfind("msg_", 0), 0u);
  const int64_t input_tokens = message["usage"]["input_tokens"].get<int64_t>();
  EXPECT_GT(input_tokens, 0);

  json count = body;
  count.erase("max_tokens");
  auto counted = cli->Post("/v1/messages/count_tokens", count.dump(), "application/json");
  ASSERT_TRUE(counted);
  ASSERT_EQ(counted->status, 200) << counted->body;
  EXPECT_EQ(json::parse(counted->body)["input_tokens"].get<int64_t>(), input_tokens);

  json streaming = body;
  streaming["stream"] = true;
  const Streamed s = PostStreaming(*cli, "/v1/messages", streaming.dump());
  ASSERT_EQ(s.status, 200);
  EXPECT_NE(s.text.find("event: message_start"), std::string::npos);
  EXPECT_NE(s.text.find("event: message_stop"), std::string::npos);
}

TEST_F(HttpServerTest, MetricsArePrometheusText) {
  auto cli = Client();
  auto done = cli->Post("/v1/chat/completions", ChatBody("Count", 3).dump(), "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200);
  auto res = cli->Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
  for (const char* name :
       {"moetier_requests_running", "moetier_requests_waiting", "moetier_prompt_tokens_total",
        "moetier_generated_tokens_total", "moetier_prompt_seconds_total",
        "moetier_time_to_first_token_seconds_sum", "moetier_kv_cache_usage_ratio",
        "moetier_prefix_cache_hit_tokens_total"})
    EXPECT_NE(res->body.find(std::string("\n") + name + " "), std::string::npos) << name;
  const size_t at = res->body.find("\nmoetier_generated_tokens_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stoll(res->body.substr(at + 32)), 0);
  // The model's figures: every expert of the cpu backend on the CPU, bytes by tier.
  const std::string cpu = "\nmoetier_experts_run_on_cpu_total ";
  const size_t cpu_at = res->body.find(cpu);
  ASSERT_NE(cpu_at, std::string::npos);
  EXPECT_GT(std::stoll(res->body.substr(cpu_at + cpu.size())), 0);
  EXPECT_NE(res->body.find("\nmoetier_experts_run_on_gpu_total 0\n"), std::string::npos);
  EXPECT_NE(res->body.find("moetier_expert_bytes{tier=\"locked\"}"), std::string::npos);
  EXPECT_NE(res->body.find("\nmoetier_expert_cache_hit_ratio 0\n"), std::string::npos);
  EXPECT_NE(res->body.find("\nmoetier_experts_fetched_total 0\n"), std::string::npos);
  EXPECT_NE(res->body.find("\nmoetier_expert_copy_seconds_total 0\n"), std::string::npos);
}

// A client that leaves mid-stream cancels its request: it ends long before its max_tokens, and
// the server goes on serving.
TEST_F(HttpServerTest, ClientThatDisconnectsCancelsItsRequest) {
  constexpr int64_t kLongAnswer = 1000;
  auto cli = Client();
  // Left alone, this answer runs to its max_tokens (greedy: the same every time).
  auto whole =
      cli->Post("/v1/chat/completions", ChatBody("Go on", kLongAnswer).dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200);
  ASSERT_EQ(json::parse(whole->body)["choices"][0]["finish_reason"], "length");
  ASSERT_TRUE(WaitIdle(std::chrono::seconds(60)));
  const int64_t before = world->service->Metrics().generated_tokens_total;
  const Streamed s =
      PostStreaming(*cli, "/v1/chat/completions", ChatBody("Go on", kLongAnswer, true).dump(),
                    [](const std::string& so_far) { return DataLines(so_far).size() < 3; });
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.error, httplib::Error::Canceled);
  ASSERT_TRUE(WaitIdle(std::chrono::seconds(60)));
  const int64_t generated = world->service->Metrics().generated_tokens_total - before;
  EXPECT_GE(generated, 2);
  EXPECT_LT(generated, kLongAnswer / 2);

  auto after = Client()->Post("/v1/chat/completions", ChatBody("Still there?", 2).dump(),
                              "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

// The same for a non-streamed request, which sends nothing before its answer is whole: the
// server notices the closed connection (peer_socket.h) and cancels it.
TEST_F(HttpServerTest, ClientThatDisconnectsBeforeAWholeAnswerCancelsIt) {
  constexpr int64_t kLongAnswer = 1000;
  ASSERT_TRUE(WaitIdle(std::chrono::seconds(60)));
  const int64_t before = world->service->Metrics().generated_tokens_total;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(world->server->port()));
  ASSERT_EQ(::inet_pton(AF_INET, kHost, &addr.sin_addr), 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  const std::string body = ChatBody("Go on", kLongAnswer).dump();
  const std::string request =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
      "Authorization: Bearer " +
      std::string(kKey) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  // Wait until it generates, then hang up.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (world->service->Metrics().generated_tokens_total - before < 2 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::close(fd);
  ASSERT_TRUE(WaitIdle(std::chrono::seconds(60)));
  const int64_t generated = world->service->Metrics().generated_tokens_total - before;
  EXPECT_GE(generated, 2);
  EXPECT_LT(generated, kLongAnswer / 2);
}

// Requests at once are batched and each gets the answer it gets alone (greedy).
TEST_F(HttpServerTest, ConcurrentRequestsAllComplete) {
  constexpr int kClients = 6;
  const std::string body = ChatBody("Same question", 8).dump();
  auto alone = Client()->Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(alone);
  ASSERT_EQ(alone->status, 200);
  const json expected = json::parse(alone->body)["choices"][0]["message"];

  std::vector<std::string> answers(kClients);
  std::vector<int> statuses(kClients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      if (i % 2 == 1) {  // half of them streamed
        auto cli = Client();
        const Streamed s =
            PostStreaming(*cli, "/v1/chat/completions", ChatBody("Same question", 8, true).dump());
        statuses[i] = s.status;
        answers[i] = DataLines(s.text).empty() ? "" : DataLines(s.text).back();
        return;
      }
      auto res = Client()->Post("/v1/chat/completions", body, "application/json");
      if (!res) return;
      statuses[i] = res->status;
      answers[i] = res->body;
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(statuses[i], 200) << "client " << i;
    if (i % 2 == 1) {
      EXPECT_EQ(answers[i], "[DONE]") << "client " << i;
    } else {
      EXPECT_EQ(json::parse(answers[i])["choices"][0]["message"], expected) << "client " << i;
    }
  }
}

// While nothing has come yet (a queue, a long prefill), a stream gets ": ping" comments.
TEST_F(HttpServerTest, StreamPingsWhileNothingHasComeYet) {
  ServerOptions options;
  options.ping_interval = std::chrono::milliseconds(1);
  RunningServer pinging(world->service.get(), options);
  auto cli = Client(/*with_key=*/false, pinging.port());
  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "the quick brown fox jumps over the lazy dog ";
  const Streamed s =
      PostStreaming(*cli, "/v1/chat/completions", ChatBody(long_prompt, 2, true).dump());
  ASSERT_EQ(s.status, 200);
  const size_t ping = s.text.find(": ping\n\n");
  ASSERT_NE(ping, std::string::npos);
  EXPECT_LT(ping, s.text.find("data: "));
  EXPECT_EQ(DataLines(s.text).back(), "[DONE]");
}

// Bound before the model loads: /health says loading (with progress), the API routes 503.
TEST_F(HttpServerTest, LoadingServerAnswers503UntilItHasAService) {
  RunningServer loading(nullptr, ServerOptions{});
  auto cli = Client(/*with_key=*/false, loading.port());
  loading.server().SetLoadProgress(0.25);
  auto health = cli->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  const json h = json::parse(health->body);
  EXPECT_EQ(h["status"], "loading");
  EXPECT_DOUBLE_EQ(h["progress"].get<double>(), 0.25);
  auto chat = cli->Post("/v1/chat/completions", ChatBody("Hi", 2).dump(), "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 503);
  EXPECT_FALSE(chat->get_header_value("Retry-After").empty());
  EXPECT_TRUE(json::parse(chat->body)["error"].contains("message"));

  loading.server().SetService(*world->service);
  auto ready = cli->Get("/health");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  auto models = cli->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
}

// Stop cancels what is in flight and answers it before closing: a whole answer still waiting
// ends with 503, a stream with its last chunk and [DONE]; then Listen returns.
TEST_F(HttpServerTest, StopAnswersRequestsInFlight) {
  std::optional<RunningServer> stopping;
  stopping.emplace(world->service.get(), ServerOptions{});
  const int port = stopping->port();
  std::atomic<int> whole_status{0};
  std::thread whole([&] {
    auto cli = Client(/*with_key=*/false, port);
    auto res = cli->Post("/v1/chat/completions", ChatBody("Long", 3000).dump(), "application/json");
    whole_status = res ? res->status : -1;
  });
  Streamed streamed;
  std::thread stream([&] {
    auto cli = Client(/*with_key=*/false, port);
    streamed = PostStreaming(*cli, "/v1/chat/completions", ChatBody("Longer", 3000, true).dump());
  });
  // Once both run, stop the server.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (world->service->Metrics().requests_running < 2 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stopping.reset();  // Stop, and join Listen
  whole.join();
  stream.join();
  EXPECT_EQ(whole_status, 503);
  EXPECT_EQ(streamed.status, 200);
  const std::vector<std::string> data = DataLines(streamed.text);
  ASSERT_FALSE(data.empty());
  EXPECT_EQ(data.back(), "[DONE]");
  EXPECT_TRUE(WaitIdle(std::chrono::seconds(60)));
}

}  // namespace
}  // namespace moetier::server
