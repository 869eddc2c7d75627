// ChatService on a real engine (Engine::Start, its own thread) and the real-vocabulary Qwen3
// fixture: the events of an answer in order with its usage, cached tokens on a repeated prompt,
// max_tokens, stop strings, cancellation, a prompt past the context, a full queue, tools in
// the prompt, raw prompts and the metrics. The fixture's weights are random, so its greedy text
// is gibberish, but the same every run.
#include "server/chat_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace moetier::server {
namespace {

using namespace std::chrono_literals;

// (The target links the server library alone, without tests/support: the two helpers it needs.)
std::filesystem::path Fixture() {
  return std::filesystem::path(MOETIER_FIXTURES_DIR) / "hf/realvocab/qwen3_moe_tiny";
}

std::unique_ptr<Engine> NewEngine(CausalLM& model, const text::Tokenizer& tok, int64_t kv_positions,
                                  int parallel) {
  EngineOptions o;
  o.kv_positions = kv_positions;
  o.max_running = parallel;
  auto e = Engine::Create(model, &tok, o);
  EXPECT_TRUE(e.ok()) << e.message();
  return e.ok() ? std::move(e).value() : nullptr;
}

// The events of one request, collected from the engine's thread.
class Collector {
 public:
  ChatSink Sink() {
    return [this](const ChatEvent& e) {
      std::lock_guard<std::mutex> l(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
  }
  // Waits for kFinished (a generous bound: a hung request fails the test instead of the run).
  std::vector<ChatEvent> Wait() {
    std::unique_lock<std::mutex> l(mu_);
    const bool done = cv_.wait_for(l, 120s, [&] {
      return !events_.empty() && events_.back().kind == ChatEvent::Kind::kFinished;
    });
    EXPECT_TRUE(done) << "no kFinished within the time limit";
    return events_;
  }
  // Waits for the first event.
  void WaitAny() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, 120s, [&] { return !events_.empty(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ChatEvent> events_;
};

// What the events say: text by kind, and the finish.
struct Answer {
  std::string content, reasoning;
  ChatEvent finished;
  int n_finished = 0;
  bool finished_last = false;
};

Answer Summarize(const std::vector<ChatEvent>& events) {
  Answer a;
  for (const ChatEvent& e : events) {
    if (e.kind == ChatEvent::Kind::kContent) a.content += e.text;
    if (e.kind == ChatEvent::Kind::kReasoning) a.reasoning += e.text;
    if (e.kind == ChatEvent::Kind::kFinished) {
      a.finished = e;
      ++a.n_finished;
    }
  }
  a.finished_last = !events.empty() && events.back().kind == ChatEvent::Kind::kFinished;
  return a;
}

ChatRequest UserSays(const std::string& text, int64_t max_tokens) {
  ChatRequest r;
  ChatMessage m;
  m.role = ChatMessage::Role::kUser;
  m.content = text;
  r.messages.push_back(m);
  r.sampling.temperature = 0.0f;  // greedy: the same answer every run
  r.sampling.max_tokens = max_tokens;
  return r;
}

ToolDefinition WeatherTool() {
  ToolDefinition t;
  t.name = "get_weather";
  t.description = "The weather in a city now";
  t.parameters = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
  return t;
}

class ChatServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = Fixture();
    auto m = LoadCausalLM(dir, LoadOptions());
    ASSERT_TRUE(m.ok()) << m.message();
    model_ = std::move(m).value().release();
    auto t = text::Tokenizer::Load(dir);
    ASSERT_TRUE(t.ok()) << t.message();
    tok_ = new text::Tokenizer(std::move(t).value());
    auto c = text::ChatTemplate::Load(dir);
    ASSERT_TRUE(c.ok()) << c.message();
    chat_ = new text::ChatTemplate(std::move(c).value());
  }
  static void TearDownTestSuite() {
    delete chat_;
    delete tok_;
    delete model_;
  }

  // A service on a fresh engine of `kv_positions`; started unless told otherwise.
  void Make(int64_t kv_positions = 1024, int parallel = 2, ChatServiceOptions options = {},
            bool start = true) {
    engine_ = NewEngine(*model_, *tok_, kv_positions, parallel);
    ASSERT_NE(engine_, nullptr);
    service_ = std::make_unique<ChatService>(*model_, *engine_, *tok_, chat_, options);
    if (start) engine_->Start();
  }
  void TearDown() override {
    if (engine_) engine_->Stop();
    service_.reset();
  }

  Answer Run(const ChatRequest& r) {
    Collector c;
    RequestError error;
    auto id = service_->Start(r, c.Sink(), &error);
    EXPECT_TRUE(id.ok()) << error.message;
    if (!id.ok()) return {};
    return Summarize(c.Wait());
  }

  static CausalLM* model_;
  static text::Tokenizer* tok_;
  static text::ChatTemplate* chat_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ChatService> service_;
};

CausalLM* ChatServiceTest::model_ = nullptr;
text::Tokenizer* ChatServiceTest::tok_ = nullptr;
text::ChatTemplate* ChatServiceTest::chat_ = nullptr;

// The greedy answers of the fixture used below (found by a first run): "Hi" gives "Beta" over
// and over; "What is 2+2?" gives "No" and then " responding" twenty times, then "Beta"s.
constexpr const char* kBetaPrompt = "Hi";
constexpr const char* kRespondingPrompt = "What is 2+2?";

TEST_F(ChatServiceTest, AnswerEventsComeInOrderWithUsage) {
  Make();
  const ChatRequest r = UserSays(kBetaPrompt, 8);
  const auto n_prompt = service_->CountPromptTokens(r);
  ASSERT_TRUE(n_prompt.ok()) << n_prompt.message();
  Collector c;
  RequestError error;
  ASSERT_TRUE(service_->Start(r, c.Sink(), &error).ok()) << error.message;
  const std::vector<ChatEvent> events = c.Wait();
  const Answer a = Summarize(events);
  EXPECT_EQ(a.n_finished, 1);
  EXPECT_TRUE(a.finished_last);
  for (size_t i = 0; i + 1 < events.size(); ++i)
    EXPECT_EQ(events[i].kind, ChatEvent::Kind::kContent) << i;
  EXPECT_EQ(a.content, "BetaBetaBetaBetaBetaBetaBetaBeta");
  EXPECT_EQ(a.reasoning, "");
  // max_tokens ends it: finish reason length, with every token counted.
  EXPECT_EQ(a.finished.finish_reason, FinishReason::kLength);
  EXPECT_EQ(a.finished.usage.completion_tokens, 8);
  EXPECT_EQ(a.finished.usage.prompt_tokens, *n_prompt);
  EXPECT_EQ(a.finished.usage.cached_tokens, 0);
  EXPECT_TRUE(a.finished.stop_sequence.empty());
  EXPECT_GT(a.finished.ttft_ms, 0.0);
}

// Log-probabilities asked for: one kLogprobs event per generated token, before the text it
// gives, with the token's text and the alternatives asked for (the greedy token the first);
// their texts make up the answer. Without asking, none.
TEST_F(ChatServiceTest, LogprobsComeBeforeTheirTextOnePerToken) {
  Make();
  ChatRequest r = UserSays(kRespondingPrompt, 6);
  r.top_logprobs = 3;
  Collector c;
  RequestError error;
  ASSERT_TRUE(service_->Start(r, c.Sink(), &error).ok()) << error.message;
  const std::vector<ChatEvent> events = c.Wait();
  const Answer a = Summarize(events);
  std::string tokens_text, text_so_far;
  int n = 0;
  for (const ChatEvent& e : events) {
    if (e.kind == ChatEvent::Kind::kContent) {
      text_so_far += e.text;
      EXPECT_LE(text_so_far.size(), tokens_text.size()) << "text before its token's logprobs";
    }
    if (e.kind != ChatEvent::Kind::kLogprobs) continue;
    ++n;
    tokens_text += e.logprobs.chosen.token;
    EXPECT_LE(e.logprobs.chosen.logprob, 0.0f);
    ASSERT_EQ(e.logprobs.top.size(), 3u);
    EXPECT_EQ(e.logprobs.top[0].token, e.logprobs.chosen.token) << "greedy";
    EXPECT_EQ(e.logprobs.top[0].logprob, e.logprobs.chosen.logprob);
    EXPECT_GE(e.logprobs.top[1].logprob, e.logprobs.top[2].logprob);
  }
  EXPECT_EQ(n, a.finished.usage.completion_tokens);
  EXPECT_EQ(tokens_text, a.content);
  EXPECT_EQ(a.content, "No responding responding responding responding responding");

  r.top_logprobs = -1;
  Collector without;
  ASSERT_TRUE(service_->Start(r, without.Sink(), &error).ok()) << error.message;
  for (const ChatEvent& e : without.Wait()) EXPECT_NE(e.kind, ChatEvent::Kind::kLogprobs);
}

// A raw prompt of token ids, echoed with log-probabilities: an entry for every prompt token (the
// first without a value) before the prompt's text, then one per generated token; the entries'
// texts are the prompt's and the answer's. An id outside the vocabulary is refused, naming it.
TEST_F(ChatServiceTest, EchoedTokenPromptComesFirstWithItsLogprobs) {
  Make();
  ChatRequest r;
  r.raw_prompt = true;
  r.prompt_ids = tok_->Encode("Once upon a time", false);
  ASSERT_GE(r.prompt_ids.size(), 3u);
  r.echo = true;
  r.top_logprobs = 2;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 4;
  Collector c;
  RequestError error;
  ASSERT_TRUE(service_->Start(r, c.Sink(), &error).ok()) << error.message;
  const std::vector<ChatEvent> events = c.Wait();
  const Answer a = Summarize(events);
  std::vector<TokenLogprobEntry> entries;
  size_t echo_at = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind == ChatEvent::Kind::kLogprobs) entries.push_back(events[i].logprobs);
    if (events[i].kind == ChatEvent::Kind::kContent && echo_at == 0) {
      echo_at = i;
      EXPECT_EQ(events[i].text, "Once upon a time");
      EXPECT_EQ(entries.size(), r.prompt_ids.size()) << "the prompt's entries before its text";
    }
  }
  ASSERT_EQ(entries.size(), r.prompt_ids.size() + 4);
  EXPECT_TRUE(std::isnan(entries[0].chosen.logprob));
  EXPECT_TRUE(entries[0].top.empty());
  std::string text;
  for (size_t i = 0; i < entries.size(); ++i) {
    text += entries[i].chosen.token;
    if (i == 0) continue;
    EXPECT_LE(entries[i].chosen.logprob, 0.0f) << i;
    EXPECT_EQ(entries[i].top.size(), 2u) << i;
  }
  EXPECT_EQ(text, a.content);
  EXPECT_EQ(a.content.rfind("Once upon a time", 0), 0u);

  r.prompt_ids.push_back(static_cast<int32_t>(model_->config().vocab_size));
  EXPECT_FALSE(service_->Start(r, c.Sink(), &error).ok());
  EXPECT_EQ(error.param, "prompt");
  EXPECT_NE(error.message.find("vocabulary"), std::string::npos) << error.message;
}

TEST_F(ChatServiceTest, RepeatedPromptIsServedFromThePrefixCache) {
  Make();
  const ChatRequest r = UserSays(
      "Tell me a long story about a dragon who lives on a mountain and guards its gold.", 6);
  const Answer first = Run(r);
  const Answer second = Run(r);
  EXPECT_EQ(first.finished.usage.cached_tokens, 0);
  // Whole KV blocks of the prompt are reused (at least one of 16 positions).
  EXPECT_GE(second.finished.usage.cached_tokens, 16);
  EXPECT_LT(second.finished.usage.cached_tokens, second.finished.usage.prompt_tokens);
  EXPECT_EQ(second.finished.usage.prompt_tokens, first.finished.usage.prompt_tokens);
  EXPECT_EQ(second.content, first.content);
  const ServiceMetrics m = service_->Metrics();
  EXPECT_EQ(m.cached_prompt_tokens_total, second.finished.usage.cached_tokens);
}

TEST_F(ChatServiceTest, StopStringEndsTheAnswerAndIsReported) {
  Make();
  ChatRequest r = UserSays(kRespondingPrompt, 30);
  // Across a token boundary: " responding" is one token, the stop ends inside it.
  r.sampling.stop = {"zzz", "ding respon"};
  Answer a = Run(r);
  EXPECT_EQ(a.content, "No respon");
  EXPECT_EQ(a.finished.finish_reason, FinishReason::kStop);
  EXPECT_EQ(a.finished.stop_sequence, "ding respon");
  EXPECT_LT(a.finished.usage.completion_tokens, 30);
  // The earliest of several stops in the text wins, whatever their order in the list.
  r.sampling.stop = {"Beta", "responding responding"};
  a = Run(r);
  EXPECT_EQ(a.content, "No ");
  EXPECT_EQ(a.finished.stop_sequence, "responding responding");
}

TEST_F(ChatServiceTest, CancelEndsTheRequest) {
  Make();
  Collector c;
  RequestError error;
  auto id = service_->Start(UserSays(kBetaPrompt, 100000), c.Sink(), &error);
  ASSERT_TRUE(id.ok()) << error.message;
  c.WaitAny();
  service_->Cancel(*id);
  const Answer a = Summarize(c.Wait());
  EXPECT_EQ(a.finished.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(a.finished.usage.completion_tokens, 900);
  EXPECT_EQ(service_->Metrics().requests_running, 0);
}

TEST_F(ChatServiceTest, PromptLongerThanTheContextIsRefusedNamingTheLimit) {
  Make(/*kv_positions=*/64);
  std::string text;
  for (int i = 0; i < 100; ++i) text += "word ";
  Collector c;
  RequestError error;
  auto id = service_->Start(UserSays(text, 4), c.Sink(), &error);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.param, "messages");
  EXPECT_NE(error.message.find("64"), std::string::npos) << error.message;
  EXPECT_EQ(service_->Metrics().requests_total, 0);
}

TEST_F(ChatServiceTest, FullQueueIsRefusedWith503) {
  ChatServiceOptions options;
  options.max_waiting = 1;
  Make(1024, /*parallel=*/1, options, /*start=*/false);
  Collector first, second, third;
  RequestError error;
  ASSERT_TRUE(service_->Start(UserSays(kBetaPrompt, 2), first.Sink(), &error).ok());
  ASSERT_TRUE(service_->Start(UserSays(kBetaPrompt, 2), second.Sink(), &error).ok());
  ServiceMetrics m = service_->Metrics();
  EXPECT_EQ(m.requests_running, 1);
  EXPECT_EQ(m.requests_waiting, 1);
  auto refused = service_->Start(UserSays(kBetaPrompt, 2), third.Sink(), &error);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(error.http_status, 503);
  engine_->Start();
  EXPECT_EQ(Summarize(first.Wait()).finished.finish_reason, FinishReason::kLength);
  EXPECT_EQ(Summarize(second.Wait()).finished.finish_reason, FinishReason::kLength);
  // Room again once they are done.
  EXPECT_EQ(Run(UserSays(kBetaPrompt, 2)).finished.usage.completion_tokens, 2);
}

TEST_F(ChatServiceTest, ToolsRenderIntoThePrompt) {
  Make();
  const ChatRequest plain = UserSays("What is the weather in Paris?", 4);
  ChatRequest with_tools = plain;
  with_tools.tools = {WeatherTool()};
  ChatRequest tools_off = with_tools;
  tools_off.tool_choice = ToolChoice::kNone;
  ChatRequest named = with_tools;
  named.tool_choice = ToolChoice::kNamed;
  named.tool_choice_name = "get_weather";
  const int64_t n_plain = *service_->CountPromptTokens(plain);
  const int64_t n_tools = *service_->CountPromptTokens(with_tools);
  // The tool's schema is in the prompt (its description alone is several tokens)...
  EXPECT_GT(n_tools, n_plain + 20);
  // ...not under tool_choice none...
  EXPECT_EQ(*service_->CountPromptTokens(tools_off), n_plain);
  // ...and a named choice adds the instruction and the call's opening.
  EXPECT_GT(*service_->CountPromptTokens(named), n_tools);
  const Answer a = Run(with_tools);
  EXPECT_EQ(a.finished.usage.prompt_tokens, n_tools);
  EXPECT_EQ(a.finished.finish_reason, FinishReason::kLength);
}

TEST_F(ChatServiceTest, ToolHistoryRendersAndBadArgumentsAreNamed) {
  Make();
  ChatRequest r = UserSays("What is the weather in Paris?", 2);
  r.tools = {WeatherTool()};
  ChatMessage call;
  call.role = ChatMessage::Role::kAssistant;
  call.reasoning_content = "I should look it up.";
  call.tool_calls = {ToolCall{"call_1", "get_weather", R"({"city": "Paris"})"}};
  ChatMessage result;
  result.role = ChatMessage::Role::kTool;
  result.tool_call_id = "call_1";
  result.content = "sunny";
  r.messages.push_back(call);
  r.messages.push_back(result);
  const auto n = service_->CountPromptTokens(r);
  ASSERT_TRUE(n.ok()) << n.message();
  EXPECT_EQ(Run(r).finished.usage.prompt_tokens, *n);

  r.messages[1].tool_calls[0].arguments = "{not json";
  Collector c;
  RequestError error;
  EXPECT_FALSE(service_->Start(r, c.Sink(), &error).ok());
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.param, "messages[1].tool_calls[0].function.arguments");
}

TEST_F(ChatServiceTest, TemplateKwargsReachTheTemplate) {
  Make();
  ChatRequest r = UserSays(kBetaPrompt, 2);
  const int64_t n = *service_->CountPromptTokens(r);
  r.template_kwargs = {{"enable_thinking", false}};
  // Qwen3's template closes an empty <think></think> block when thinking is off.
  EXPECT_GT(*service_->CountPromptTokens(r), n);
}

TEST_F(ChatServiceTest, PromptEndingInsideThinkStartsInReasoning) {
  auto t = text::ChatTemplate::FromSource(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n",
      nullptr);
  ASSERT_TRUE(t.ok()) << t.message();
  engine_ = NewEngine(*model_, *tok_, 1024, 1);
  service_ = std::make_unique<ChatService>(*model_, *engine_, *tok_, &*t);
  engine_->Start();
  const Answer a = Run(UserSays(kBetaPrompt, 6));
  EXPECT_FALSE(a.reasoning.empty());
  EXPECT_EQ(a.content, "");
  // That template renders no tool calls: tools are refused, naming them.
  ChatRequest r = UserSays(kBetaPrompt, 2);
  r.tools = {WeatherTool()};
  Collector c;
  RequestError error;
  EXPECT_FALSE(service_->Start(r, c.Sink(), &error).ok());
  EXPECT_EQ(error.param, "tools");
  engine_->Stop();
  service_.reset();
}

TEST_F(ChatServiceTest, NoTemplateTakesRawPromptsOnly) {
  engine_ = NewEngine(*model_, *tok_, 1024, 1);
  service_ = std::make_unique<ChatService>(*model_, *engine_, *tok_, nullptr);
  engine_->Start();
  EXPECT_EQ(service_->model_name(), "qwen3_moe_tiny");
  Collector c;
  RequestError error;
  EXPECT_FALSE(service_->Start(UserSays(kBetaPrompt, 2), c.Sink(), &error).ok());
  EXPECT_EQ(error.param, "messages");

  ChatRequest raw;
  raw.raw_prompt = true;
  raw.prompt = "Once upon a time";
  raw.sampling.temperature = 0.0f;
  raw.sampling.max_tokens = 5;
  const Answer a = Run(raw);
  EXPECT_EQ(a.finished.usage.completion_tokens, 5);
  EXPECT_EQ(a.finished.usage.prompt_tokens,
            static_cast<int64_t>(tok_->Encode(raw.prompt, /*add_special_tokens=*/true).size()));
  EXPECT_FALSE(a.content.empty());
  raw.prompt = "";
  EXPECT_FALSE(service_->Start(raw, c.Sink(), &error).ok());
  EXPECT_EQ(error.param, "prompt");
}

TEST_F(ChatServiceTest, PenaltiesAndSeedReachTheSampler) {
  Make();
  ChatRequest r = UserSays(kBetaPrompt, 12);
  const Answer greedy = Run(r);
  r.sampling.frequency_penalty = 2.0f;
  const Answer penalised = Run(r);
  // "Beta" twelve times without; the penalty makes the answer vary.
  EXPECT_EQ(greedy.content, "BetaBetaBetaBetaBetaBetaBetaBetaBetaBetaBetaBeta");
  EXPECT_NE(penalised.content, greedy.content);
  // A seeded sampled answer repeats.
  r = UserSays(kBetaPrompt, 12);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 7;
  EXPECT_EQ(Run(r).content, Run(r).content);
  // Out-of-range sampling is refused before anything runs.
  r.sampling.presence_penalty = 5.0f;
  Collector c;
  RequestError error;
  EXPECT_FALSE(service_->Start(r, c.Sink(), &error).ok());
  EXPECT_EQ(error.http_status, 400);
}

TEST_F(ChatServiceTest, MetricsCountRequestsAndTokens) {
  Make();
  Run(UserSays(kBetaPrompt, 3));
  const Answer a = Run(UserSays(kRespondingPrompt, 4));
  const ServiceMetrics m = service_->Metrics();
  EXPECT_EQ(m.requests_total, 2);
  EXPECT_EQ(m.requests_running, 0);
  EXPECT_EQ(m.requests_waiting, 0);
  EXPECT_EQ(m.generated_tokens_total, 7);
  EXPECT_GE(m.prompt_tokens_total, 2 * a.finished.usage.prompt_tokens - 8);
  EXPECT_GT(m.prompt_seconds_total, 0.0);
  EXPECT_GT(m.kv_blocks_total, 0);
  EXPECT_LE(m.kv_blocks_used, m.kv_blocks_total);
}

// A named tool_choice writes the call's opening into the prompt and the parser starts inside
// the call; the fixture's gibberish never closes it, so at the end it comes back as content.
TEST_F(ChatServiceTest, NamedToolChoiceOpensTheCall) {
  Make();
  ChatRequest r = UserSays("What is the weather in Paris?", 6);
  r.tools = {WeatherTool()};
  r.tool_choice = ToolChoice::kNamed;
  r.tool_choice_name = "get_weather";
  const Answer a = Run(r);
  EXPECT_EQ(a.content.rfind("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", 0), 0u)
      << a.content;
  EXPECT_GT(a.content.size(), 50u);  // and the model's text after it
  EXPECT_EQ(a.finished.finish_reason, FinishReason::kLength);
  EXPECT_EQ(a.finished.usage.completion_tokens, 6);
}

}  // namespace
}  // namespace moetier::server
