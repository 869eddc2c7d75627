// The Anthropic Messages translation: request bodies into ChatRequests (every field, every
// error naming its field, hostile bytes), and scripted ChatEvent sequences into the message
// object and into the streaming events, the stream checked as Anthropic's SDK reads it and
// folded back into the same message.
#include "server/anthropic_api.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "support/seed.h"

namespace moetier::server::anthropic {
namespace {

using Json = nlohmann::ordered_json;
using Role = ChatMessage::Role;

ParsedRequest MustParse(std::string_view body, bool count_tokens = false) {
  RequestError error;
  auto parsed = ParseRequest(body, count_tokens, &error);
  EXPECT_TRUE(parsed.ok()) << body << "\n → " << error.message;
  return parsed.ok() ? *parsed : ParsedRequest{};
}

RequestError MustFail(std::string_view body, bool count_tokens = false) {
  RequestError error;
  auto parsed = ParseRequest(body, count_tokens, &error);
  EXPECT_FALSE(parsed.ok()) << body;
  if (!parsed.ok()) {
    EXPECT_EQ(parsed.message(), error.message);
  }
  return error;
}

// A valid body with `extra` fields merged in (a null value removes the field).
std::string Body(const Json& extra) {
  Json body = {{"model", "tiny"},
               {"max_tokens", 16},
               {"messages", Json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  for (const auto& [key, value] : extra.items()) {
    if (value.is_null()) {
      body.erase(key);
    } else {
      body[key] = value;
    }
  }
  return body.dump();
}

// A valid body whose metadata holds `n_keys` keys.
std::string WideBody(int n_keys) {
  std::string metadata = "{";
  for (int i = 0; i < n_keys; ++i) {
    metadata += (i > 0 ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  }
  metadata += "}";
  std::string body = Body({});
  return body.insert(1, "\"metadata\":" + metadata + ",");
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

TEST(AnthropicParse, MinimalRequest) {
  const ParsedRequest p = MustParse(Body({}));
  EXPECT_FALSE(p.stream);
  EXPECT_EQ(p.request.model, "tiny");
  ASSERT_TRUE(p.request.sampling.max_tokens.has_value());
  EXPECT_EQ(*p.request.sampling.max_tokens, 16);
  ASSERT_EQ(p.request.messages.size(), 1u);
  EXPECT_EQ(p.request.messages[0].role, Role::kUser);
  EXPECT_EQ(p.request.messages[0].content, "Hi");
  EXPECT_TRUE(p.request.tools.empty());
  EXPECT_EQ(p.request.template_kwargs, Json({{"enable_thinking", false}}));  // no thinking asked
  EXPECT_FALSE(p.request.raw_prompt);
}

TEST(AnthropicParse, SamplingFieldsAndIgnoredOnes) {
  const ParsedRequest p = MustParse(Body({{"temperature", 0.25},
                                          {"top_p", 0.5},
                                          {"top_k", 40},
                                          {"stop_sequences", {"END", "\n\n"}},
                                          {"stream", true},
                                          {"metadata", {{"user_id", "u1"}}},
                                          {"service_tier", "auto"},
                                          {"some_future_field", {1, 2, 3}}}));
  EXPECT_TRUE(p.stream);
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 0.25f);
  EXPECT_FLOAT_EQ(p.request.sampling.top_p, 0.5f);
  EXPECT_EQ(p.request.sampling.top_k, 40);
  EXPECT_EQ(p.request.sampling.stop, (std::vector<std::string>{"END", "\n\n"}));
}

TEST(AnthropicParse, SystemAsStringOrTextBlocks) {
  ParsedRequest p = MustParse(Body({{"system", "Be brief."}}));
  ASSERT_EQ(p.request.messages.size(), 2u);
  EXPECT_EQ(p.request.messages[0].role, Role::kSystem);
  EXPECT_EQ(p.request.messages[0].content, "Be brief.");
  EXPECT_EQ(p.request.messages[1].role, Role::kUser);

  p = MustParse(
      Body({{"system",
             {{{"type", "text"}, {"text", "One."}},
              {{"type", "text"}, {"text", "Two."}, {"cache_control", {{"type", "x"}}}}}}}));
  ASSERT_EQ(p.request.messages.size(), 2u);
  EXPECT_EQ(p.request.messages[0].content, "One.\nTwo.");
}

TEST(AnthropicParse, ContentBlocksOfBothRoles) {
  const Json messages = {
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
      {{"role", "assistant"},
       {"content",
        {{{"type", "thinking"}, {"thinking", "hmm"}, {"signature", "sig"}},
         {{"type", "redacted_thinking"}, {"data", "opaque"}},
         {{"type", "text"}, {"text", "Let me look."}},
         {{"type", "tool_use"},
          {"id", "toolu_1"},
          {"name", "get_weather"},
          {"input", {{"city", "Paris"}, {"days", 2}}}}}}},
      {{"role", "user"},
       {"content",
        {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}},
         {{"type", "text"}, {"text", "thanks"}}}}},
      {{"role", "assistant"}, {"content", "You're welcome."}}};
  const ParsedRequest p = MustParse(Body({{"messages", messages}}));
  const auto& m = p.request.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].role, Role::kUser);
  EXPECT_EQ(m[0].content, "a\nb");

  EXPECT_EQ(m[1].role, Role::kAssistant);
  EXPECT_EQ(m[1].reasoning_content, "hmm");
  EXPECT_EQ(m[1].content, "Let me look.");
  ASSERT_EQ(m[1].tool_calls.size(), 1u);
  EXPECT_EQ(m[1].tool_calls[0].id, "toolu_1");
  EXPECT_EQ(m[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(m[1].tool_calls[0].arguments), Json({{"city", "Paris"}, {"days", 2}}));

  EXPECT_EQ(m[2].role, Role::kTool);
  EXPECT_EQ(m[2].tool_call_id, "toolu_1");
  EXPECT_EQ(m[2].name, "get_weather");  // from the tool_use it answers
  EXPECT_EQ(m[2].content, "sunny");
  EXPECT_EQ(m[3].role, Role::kUser);
  EXPECT_EQ(m[3].content, "thanks");
  EXPECT_EQ(m[4].role, Role::kAssistant);
  EXPECT_EQ(m[4].content, "You're welcome.");
}

TEST(AnthropicParse, ToolResultsAloneBecomeToolMessagesOnly) {
  const Json messages = {
      {{"role", "user"}, {"content", "go"}},
      {{"role", "assistant"},
       {"content",
        {{{"type", "tool_use"}, {"id", "t1"}, {"name", "f"}, {"input", Json::object()}},
         {{"type", "tool_use"}, {"id", "t2"}, {"name", "g"}, {"input", {{"x", 1}}}}}}},
      {{"role", "user"},
       {"content",
        {{{"type", "tool_result"},
          {"tool_use_id", "t2"},
          {"content", {{{"type", "text"}, {"text", "p1"}}, {{"type", "text"}, {"text", "p2"}}}},
          {"is_error", true}},
         {{"type", "tool_result"}, {"tool_use_id", "t1"}}}}}};
  const ParsedRequest p = MustParse(Body({{"messages", messages}}));
  const auto& m = p.request.messages;
  ASSERT_EQ(m.size(), 4u);  // no empty user message after the results
  EXPECT_EQ(m[1].tool_calls.size(), 2u);
  EXPECT_EQ(m[1].tool_calls[0].arguments, "{}");
  EXPECT_EQ(m[2].role, Role::kTool);
  EXPECT_EQ(m[2].tool_call_id, "t2");
  EXPECT_EQ(m[2].name, "g");
  EXPECT_EQ(m[2].content, "Error: p1\np2");
  EXPECT_EQ(m[3].role, Role::kTool);
  EXPECT_EQ(m[3].tool_call_id, "t1");
  EXPECT_EQ(m[3].content, "");
}

TEST(AnthropicParse, ToolsAndToolChoice) {
  const Json tools = {
      {{"name", "get_weather"},
       {"description", "Weather by city"},
       {"input_schema",
        {{"type", "object"},
         {"properties", {{"city", {{"type", "string"}}}}},
         {"required", {"city"}}}}},
      {{"type", "custom"}, {"name", "noop"}, {"input_schema", {{"type", "object"}}}}};
  ParsedRequest p = MustParse(Body({{"tools", tools}}));
  ASSERT_EQ(p.request.tools.size(), 2u);
  EXPECT_EQ(p.request.tools[0].name, "get_weather");
  EXPECT_EQ(p.request.tools[0].description, "Weather by city");
  EXPECT_EQ(p.request.tools[0].parameters, tools[0]["input_schema"]);
  EXPECT_EQ(p.request.tools[0].parameters.begin().key(), "type");  // key order kept
  EXPECT_EQ(p.request.tools[1].description, "");
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kAuto);
  EXPECT_TRUE(p.request.parallel_tool_calls);

  p = MustParse(Body({{"tools", tools}, {"tool_choice", {{"type", "any"}}}}));
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kRequired);
  p = MustParse(Body({{"tools", tools}, {"tool_choice", {{"type", "none"}}}}));
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kNone);
  p = MustParse(Body({{"tools", tools},
                      {"tool_choice", {{"type", "auto"}, {"disable_parallel_tool_use", true}}}}));
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kAuto);
  EXPECT_FALSE(p.request.parallel_tool_calls);
  p = MustParse(Body({{"tools", tools}, {"tool_choice", {{"type", "tool"}, {"name", "noop"}}}}));
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(p.request.tool_choice_name, "noop");
}

TEST(AnthropicParse, ThinkingSetsEnableThinking) {
  ParsedRequest p = MustParse(Body({{"thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}}}));
  EXPECT_EQ(p.request.template_kwargs, Json({{"enable_thinking", true}}));
  p = MustParse(Body({{"thinking", {{"type", "disabled"}}}}));
  EXPECT_EQ(p.request.template_kwargs, Json({{"enable_thinking", false}}));
  // Absent: off, as Anthropic's API has it (not the template's default).
  p = MustParse(Body({}));
  EXPECT_EQ(p.request.template_kwargs, Json({{"enable_thinking", false}}));
}

TEST(AnthropicParse, WideObjectsUpToTheLimit) {
  EXPECT_EQ(MustParse(WideBody(256)).request.model, "tiny");
}

TEST(AnthropicParse, CountTokensNeedsNoMaxTokens) {
  const ParsedRequest p = MustParse(Body({{"max_tokens", nullptr}}), /*count_tokens=*/true);
  EXPECT_FALSE(p.request.sampling.max_tokens.has_value());
  ASSERT_EQ(p.request.messages.size(), 1u);
  const RequestError e = MustFail(Body({{"max_tokens", nullptr}}), /*count_tokens=*/false);
  EXPECT_EQ(e.param, "max_tokens");
}

TEST(AnthropicParse, NumbersAtTheirLimits) {
  EXPECT_EQ(*MustParse(Body({{"max_tokens", 1}})).request.sampling.max_tokens, 1);
  EXPECT_EQ(*MustParse(Body({{"max_tokens", 4096.0}})).request.sampling.max_tokens, 4096);
  EXPECT_FLOAT_EQ(MustParse(Body({{"temperature", 0}})).request.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(MustParse(Body({{"temperature", 1}})).request.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(MustParse(Body({{"top_p", 1}})).request.sampling.top_p, 1.0f);
  EXPECT_EQ(MustParse(Body({{"top_k", 0}})).request.sampling.top_k, 0);
}

struct BadCase {
  std::string body;
  std::string param;   // the field the error must name
  std::string phrase;  // a part of the message that says what to do
};

std::vector<BadCase> BadCases() {
  const Json user_blocks = [] {
    Json m = Json::array();
    m.push_back({{"role", "user"}, {"content", "a"}});
    m.push_back({{"role", "assistant"}, {"content", "b"}});
    m.push_back({{"role", "user"},
                 {"content",
                  {{{"type", "text"}, {"text", "see"}},
                   {{"type", "image"}, {"source", {{"type", "base64"}}}}}}});
    return m;
  }();
  auto msgs = [](Json content, std::string role = "user") {
    return Json::array({{{"role", role}, {"content", std::move(content)}}});
  };
  const Json tool = {{"name", "f"}, {"input_schema", {{"type", "object"}}}};
  return {
      {"{", "body", "not valid JSON"},
      {"", "body", "not valid JSON"},
      {"[1, 2]", "body", "must be a JSON object"},
      {"{\"model\": \"\xff\xfe\"}", "body", "not valid JSON"},  // bad UTF-8
      {std::string(100000, '[') + std::string(100000, ']'), "body", "nested deeper"},
      {WideBody(257), "body", "more than 256 keys"},
      {Body({{"model", nullptr}}), "model", "required"},
      {Body({{"model", 7}}), "model", "must be a string, not number"},
      {Body({{"max_tokens", 0}}), "max_tokens", "from 1 to"},
      {Body({{"max_tokens", -5}}), "max_tokens", "from 1 to"},
      {Body({{"max_tokens", 1.5}}), "max_tokens", "from 1 to"},
      {Body({{"max_tokens", "16"}}), "max_tokens", "not string"},
      {Body({{"max_tokens", 18446744073709551615ull}}), "max_tokens", "from 1 to"},
      {"{\"model\":\"m\",\"max_tokens\":99999999999999999999999999,\"messages\":[{\"role\":"
       "\"user\",\"content\":\"x\"}]}",
       "max_tokens", "from 1 to"},
      {"{\"model\":\"m\",\"max_tokens\":1e400,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
       "}",
       "body", "not valid JSON"},
      {Body({{"temperature", 1.5}}), "temperature", "must be in [0"},
      {Body({{"temperature", -0.1}}), "temperature", "must be in [0"},
      {Body({{"temperature", "hot"}}), "temperature", "a number"},
      {Body({{"top_p", 0}}), "top_p", "must be in (0"},
      {Body({{"top_k", -1}}), "top_k", "from 0 to"},
      {Body({{"top_k", 1e12}}), "top_k", "from 0 to"},
      {Body({{"stop_sequences", "END"}}), "stop_sequences", "an array"},
      {Body({{"stop_sequences", {"a", 3}}}), "stop_sequences.1", "a string"},
      {Body({{"stop_sequences", {""}}}), "stop_sequences.0", "not be empty"},
      {Body({{"stream", "yes"}}), "stream", "true or false"},
      {Body({{"system", 5}}), "system", "a string or an array"},
      {Body({{"system", {{{"type", "image"}}}}}), "system.0.type", "not supported"},
      {Body({{"system", {{{"type", "text"}}}}}), "system.0.text", "required"},
      {Body({{"messages", nullptr}}), "messages", "required"},
      {Body({{"messages", Json::array()}}), "messages", "at least one"},
      {Body({{"messages", "hi"}}), "messages", "an array"},
      {Body({{"messages", {5}}}), "messages.0", "an object"},
      {Body({{"messages", {{{"content", "x"}}}}}), "messages.0.role", "required"},
      {Body({{"messages", {{{"role", "system"}, {"content", "x"}}}}}), "messages.0.role",
       "top-level \"system\""},
      {Body({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), "messages.0.role",
       "\"user\" or \"assistant\""},
      {Body({{"messages", {{{"role", 1}, {"content", "x"}}}}}), "messages.0.role", "a string"},
      {Body({{"messages", {{{"role", "user"}}}}}), "messages.0.content", "required"},
      {Body({{"messages", msgs(42)}}), "messages.0.content", "a string or an array"},
      {Body({{"messages", user_blocks}}), "messages.2.content.1.type", "not supported"},
      {Body({{"messages", msgs({{{"type", "document"}}})}}), "messages.0.content.0.type",
       "not supported"},
      {Body({{"messages", msgs({{{"type", "video"}}})}}), "messages.0.content.0.type", "\"video\""},
      {Body({{"messages", msgs({{{"text", "x"}}})}}), "messages.0.content.0.type", "required"},
      {Body({{"messages", msgs({"x"})}}), "messages.0.content.0", "an object"},
      {Body({{"messages", msgs({{{"type", "text"}, {"text", 1}}})}}), "messages.0.content.0.text",
       "a string"},
      {Body({{"messages", msgs({{{"type", "tool_use"}, {"id", "a"}}})}}),
       "messages.0.content.0.type", "\"tool_use\""},
      {Body({{"messages", msgs({{{"type", "tool_result"}}})}}), "messages.0.content.0.tool_use_id",
       "required"},
      {Body({{"messages",
              msgs({{{"type", "tool_result"}, {"tool_use_id", "t"}, {"is_error", 1}}})}}),
       "messages.0.content.0.is_error", "true or false"},
      {Body({{"messages", msgs({{{"type", "tool_result"},
                                 {"tool_use_id", "t"},
                                 {"content", {{{"type", "image"}}}}}})}}),
       "messages.0.content.0.content.0.type", "not supported"},
      {Body({{"messages", msgs({{{"type", "tool_use"}, {"name", "f"}, {"input", Json::object()}}},
                               "assistant")}}),
       "messages.0.content.0.id", "required"},
      {Body({{"messages", msgs({{{"type", "tool_use"}, {"id", "a"}, {"input", Json::object()}}},
                               "assistant")}}),
       "messages.0.content.0.name", "required"},
      {Body(
           {{"messages", msgs({{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}}}, "assistant")}}),
       "messages.0.content.0.input", "required"},
      {Body(
           {{"messages", msgs({{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", "{}"}}},
                              "assistant")}}),
       "messages.0.content.0.input", "an object"},
      {Body({{"messages", msgs({{{"type", "thinking"}}}, "assistant")}}),
       "messages.0.content.0.thinking", "required"},
      {Body({{"messages", msgs({{{"type", "tool_result"}, {"tool_use_id", "t"}}}, "assistant")}}),
       "messages.0.content.0.type", "\"tool_result\""},
      {Body({{"tools", {{"name", "f"}}}}), "tools", "an array"},
      {Body({{"tools", {{{"input_schema", {{"type", "object"}}}}}}}), "tools.0.name", "required"},
      {Body({{"tools", {{{"name", ""}, {"input_schema", Json::object()}}}}}), "tools.0.name",
       "not be empty"},
      {Body({{"tools", {{{"name", "f"}}}}}), "tools.0.input_schema", "required"},
      {Body({{"tools", {{{"name", "f"}, {"input_schema", "object"}}}}}), "tools.0.input_schema",
       "an object"},
      {Body({{"tools",
              {tool, {{"name", "g"}, {"description", 3}, {"input_schema", Json::object()}}}}}),
       "tools.1.description", "a string"},
      {Body({{"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}}),
       "tools.0.type", "not supported"},
      {Body({{"tools", {tool}}, {"tool_choice", "auto"}}), "tool_choice", "an object"},
      {Body({{"tools", {tool}}, {"tool_choice", Json::object()}}), "tool_choice.type", "required"},
      {Body({{"tools", {tool}}, {"tool_choice", {{"type", "required"}}}}), "tool_choice.type",
       "\"any\""},
      {Body({{"tools", {tool}}, {"tool_choice", {{"type", "tool"}}}}), "tool_choice.name",
       "required"},
      {Body({{"tools", {tool}}, {"tool_choice", {{"type", "tool"}, {"name", "g"}}}}),
       "tool_choice.name", "no tool named \"g\""},
      {Body({{"tool_choice", {{"type", "any"}}}}), "tool_choice", "needs tools"},
      {Body({{"tools", {tool}},
             {"tool_choice", {{"type", "auto"}, {"disable_parallel_tool_use", "no"}}}}),
       "tool_choice.disable_parallel_tool_use", "true or false"},
      {Body({{"thinking", true}}), "thinking", "an object"},
      {Body({{"thinking", {{"budget_tokens", 10}}}}), "thinking.type", "required"},
      {Body({{"thinking", {{"type", "on"}}}}), "thinking.type", "\"enabled\" or \"disabled\""},
      {Body({{"thinking", {{"type", "enabled"}, {"budget_tokens", -1}}}}), "thinking.budget_tokens",
       "from 1 to"},
  };
}

TEST(AnthropicParse, EveryErrorNamesItsField) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.body.substr(0, 200));
    const RequestError e = MustFail(c.body);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, c.param);
    EXPECT_EQ(e.message.rfind(c.param + ": ", 0), 0u) << e.message;
    EXPECT_NE(e.message.find(c.phrase), std::string::npos) << e.message;
    // The error body is Anthropic's shape and valid JSON whatever bytes the message quotes.
    const Json body = Json::parse(ErrorBody(e));
    EXPECT_EQ(body["type"], "error");
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
  }
}

TEST(AnthropicParse, ErrorTypesFollowTheStatus) {
  const std::vector<std::pair<int, std::string>> cases = {{400, "invalid_request_error"},
                                                          {401, "authentication_error"},
                                                          {404, "not_found_error"},
                                                          {413, "request_too_large"},
                                                          {429, "rate_limit_error"},
                                                          {503, "overloaded_error"},
                                                          {500, "api_error"}};
  for (const auto& [status, type] : cases) {
    const Json body = Json::parse(ErrorBody(RequestError{status, "m", ""}));
    EXPECT_EQ(body["error"]["type"], type) << status;
    EXPECT_EQ(body["error"]["message"], "m");
  }
}

// Random byte edits of valid bodies: each parses or fails with a named field; none crashes.
TEST(AnthropicParse, MutatedBodiesNeverCrash) {
  const uint32_t seed = moetier::testing::TestSeed();
  std::mt19937 rng(seed);
  std::vector<std::string> seeds = {
      Body({{"system", {{{"type", "text"}, {"text", "s"}}}},
            {"tools", {{{"name", "f"}, {"input_schema", {{"type", "object"}}}}}},
            {"tool_choice", {{"type", "tool"}, {"name", "f"}}},
            {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
            {"stop_sequences", {"x"}}})};
  for (const BadCase& c : BadCases()) {
    if (c.body.size() < 4096) seeds.push_back(c.body);
  }
  const std::string alphabet = "{}[]\",:0123456789-.eE truefalsnul\\\x80\xff";
  int n_ok = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string body = seeds[rng() % seeds.size()];
    const int n_edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < n_edits && !body.empty(); ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          body.erase(at, 1 + rng() % 8);
          break;
        default:
          body.insert(at, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    RequestError error;
    auto parsed = ParseRequest(body, (rng() & 1) != 0, &error);
    if (parsed.ok()) {
      ++n_ok;
    } else {
      ASSERT_FALSE(error.param.empty()) << "seed " << seed << ": " << body;
      ASSERT_EQ(error.http_status, 400);
      ASSERT_TRUE(Json::accept(ErrorBody(error)));
    }
  }
  EXPECT_LT(n_ok, 4000);  // the edits do break bodies
}

// ---------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------

ChatEvent Text(std::string text) {
  ChatEvent e;
  e.kind = ChatEvent::Kind::kContent;
  e.text = std::move(text);
  e.usage.prompt_tokens = 11;
  e.usage.cached_tokens = 4;
  return e;
}

ChatEvent Reasoning(std::string text) {
  ChatEvent e = Text(std::move(text));
  e.kind = ChatEvent::Kind::kReasoning;
  return e;
}

ChatEvent ToolEvent(ChatEvent::Kind kind, int index, std::string id, std::string name,
                    std::string args_or_piece) {
  ChatEvent e;
  e.kind = kind;
  e.tool_index = index;
  if (kind == ChatEvent::Kind::kToolCallArgs) {
    e.text = std::move(args_or_piece);
  } else {
    e.tool_call = ToolCall{std::move(id), std::move(name), std::move(args_or_piece)};
  }
  return e;
}

ChatEvent Finished(FinishReason reason, std::string stop_sequence = "") {
  ChatEvent e;
  e.kind = ChatEvent::Kind::kFinished;
  e.finish_reason = reason;
  e.stop_sequence = std::move(stop_sequence);
  e.usage = ChatUsage{11, 4, 7};
  return e;
}

// The stream as Anthropic's SDK reads it: each event "event: NAME\ndata: JSON\n\n" with NAME
// equal to data.type; message_start first; blocks started at indexes 0, 1, 2, … and each
// stopped before the next starts; every delta of the type its block takes, to the open block;
// message_delta then message_stop last. Folds the events into the message they describe, as
// the SDK's MessageStream does (partial_json pieces joined and parsed at the block's stop).
Json FoldStream(const std::string& sse) {
  Json message;
  std::vector<std::string> input_json;
  int open = -1;
  bool delta_seen = false, stopped = false;
  size_t pos = 0;
  while (pos < sse.size()) {
    EXPECT_FALSE(stopped) << "events after message_stop";
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string event = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t newline = event.find('\n');
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    EXPECT_EQ(event.compare(newline + 1, 6, "data: "), 0) << event;
    const std::string name = event.substr(7, newline - 7);
    const Json data = Json::parse(event.substr(newline + 7));
    EXPECT_EQ(data["type"], name);
    if (name == "ping") continue;
    if (name == "message_start") {
      EXPECT_TRUE(message.is_null()) << "second message_start";
      message = data["message"];
      EXPECT_EQ(message["content"], Json::array());
      continue;
    }
    EXPECT_FALSE(message.is_null()) << name << " before message_start";
    if (message.is_null()) return message;
    Json& content = message["content"];
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started while another is open";
      EXPECT_EQ(data["index"], content.size()) << "indexes not ascending from 0";
      open = data["index"].get<int>();
      content.push_back(data["content_block"]);
      input_json.emplace_back();
    } else if (name == "content_block_delta") {
      EXPECT_EQ(data["index"], open) << "delta to a block that is not open";
      if (open < 0) continue;
      Json& block = content[open];
      const Json& delta = data["delta"];
      if (delta["type"] == "text_delta") {
        EXPECT_EQ(block["type"], "text");
        block["text"] = block["text"].get<std::string>() + delta["text"].get<std::string>();
      } else if (delta["type"] == "thinking_delta") {
        EXPECT_EQ(block["type"], "thinking");
        block["thinking"] =
            block["thinking"].get<std::string>() + delta["thinking"].get<std::string>();
      } else if (delta["type"] == "input_json_delta") {
        EXPECT_EQ(block["type"], "tool_use");
        input_json[open] += delta["partial_json"].get<std::string>();
      } else {
        ADD_FAILURE() << "unknown delta " << delta.dump();
      }
    } else if (name == "content_block_stop") {
      EXPECT_EQ(data["index"], open) << "stop of a block that is not open";
      if (open >= 0 && content[open]["type"] == "tool_use" && !input_json[open].empty()) {
        content[open]["input"] = Json::parse(input_json[open]);
      }
      open = -1;
    } else if (name == "message_delta") {
      EXPECT_EQ(open, -1) << "message_delta with a block open";
      message["stop_reason"] = data["delta"]["stop_reason"];
      message["stop_sequence"] = data["delta"]["stop_sequence"];
      EXPECT_TRUE(data["usage"].contains("output_tokens"));
      for (const auto& [key, value] : data["usage"].items()) message["usage"][key] = value;
      delta_seen = true;
    } else if (name == "message_stop") {
      EXPECT_TRUE(delta_seen) << "message_stop without message_delta";
      stopped = true;
    } else {
      ADD_FAILURE() << "unknown event " << name;
    }
  }
  EXPECT_TRUE(stopped) << "no message_stop";
  return message;
}

struct BothModes {
  Json body;    // the non-streaming message
  Json folded;  // the stream folded into a message
  std::string sse;
};

BothModes RunBothModes(const std::vector<ChatEvent>& events) {
  ResponseWriter whole("msg_test", "tiny");
  ResponseWriter streamed("msg_test", "tiny");
  BothModes out;
  for (const ChatEvent& e : events) {
    whole.Add(e);
    out.sse += streamed.Events(e);
  }
  out.body = Json::parse(whole.Body());
  out.folded = FoldStream(out.sse);
  EXPECT_EQ(out.body, out.folded) << out.sse;
  return out;
}

void ExpectEnvelope(const Json& m) {
  EXPECT_EQ(m["id"], "msg_test");
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "tiny");
  EXPECT_EQ(m["usage"]["input_tokens"], 11);
  EXPECT_EQ(m["usage"]["output_tokens"], 7);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 4);
}

TEST(AnthropicWriter, Text) {
  const BothModes r =
      RunBothModes({Text("Hel"), Text(""), Text("lo"), Finished(FinishReason::kStop)});
  ExpectEnvelope(r.body);
  EXPECT_EQ(r.body["content"], Json::parse(R"([{"type": "text", "text": "Hello"}])"));
  EXPECT_EQ(r.body["stop_reason"], "end_turn");
  EXPECT_TRUE(r.body["stop_sequence"].is_null());
  // message_start carries the prompt's usage as soon as it is known.
  const size_t data_at = r.sse.find("data: ") + 6;
  const Json start = Json::parse(r.sse.substr(data_at, r.sse.find("\n\n") - data_at));
  EXPECT_EQ(start["message"]["usage"]["input_tokens"], 11);
  EXPECT_EQ(start["message"]["usage"]["output_tokens"], 0);
  EXPECT_EQ(start["message"]["id"], "msg_test");
}

TEST(AnthropicWriter, ThinkingThenText) {
  const BothModes r = RunBothModes(
      {Reasoning("Let me "), Reasoning("think."), Text("Answer."), Finished(FinishReason::kStop)});
  EXPECT_EQ(r.body["content"], Json::parse(R"([
      {"type": "thinking", "thinking": "Let me think.", "signature": ""},
      {"type": "text", "text": "Answer."}])"));
  EXPECT_NE(r.sse.find(R"("delta":{"type":"thinking_delta","thinking":"Let me "})"),
            std::string::npos);
  EXPECT_NE(r.sse.find(R"("index":1,"delta":{"type":"text_delta","text":"Answer."})"),
            std::string::npos);
}

TEST(AnthropicWriter, ToolUseWithStreamedInput) {
  const BothModes r = RunBothModes(
      {Text("Checking."),
       ToolEvent(ChatEvent::Kind::kToolCallBegin, 0, "call_abc", "get_weather", ""),
       ToolEvent(ChatEvent::Kind::kToolCallArgs, 0, "", "", "{\"city\": "),
       ToolEvent(ChatEvent::Kind::kToolCallArgs, 0, "", "", "\"Paris\""),
       ToolEvent(ChatEvent::Kind::kToolCallEnd, 0, "call_abc", "get_weather",
                 "{\"city\": \"Paris\"}"),
       ToolEvent(ChatEvent::Kind::kToolCallBegin, 1, "call_def", "get_time", ""),
       ToolEvent(ChatEvent::Kind::kToolCallEnd, 1, "call_def", "get_time", "{\"tz\": 1}"),
       Finished(FinishReason::kToolCalls)});
  ExpectEnvelope(r.body);
  EXPECT_EQ(r.body["content"], Json::parse(R"([
      {"type": "text", "text": "Checking."},
      {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
      {"type": "tool_use", "id": "toolu_def", "name": "get_time", "input": {"tz": 1}}])"));
  EXPECT_EQ(r.body["stop_reason"], "tool_use");
  // The streamed pieces, then the rest of the arguments at the end; a call with no pieces
  // sends its whole input at once.
  EXPECT_NE(r.sse.find(R"({"type":"input_json_delta","partial_json":"{\"city\": "})"),
            std::string::npos);
  EXPECT_NE(r.sse.find(R"({"type":"input_json_delta","partial_json":"}"})"), std::string::npos);
  EXPECT_NE(r.sse.find(R"({"type":"input_json_delta","partial_json":"{\"tz\": 1}"})"),
            std::string::npos);
  const std::string tool_start =
      R"("content_block":{"type":"tool_use","id":"toolu_abc","name":"get_weather",)"
      R"("input":{}})";
  EXPECT_NE(r.sse.find(tool_start), std::string::npos);
}

TEST(AnthropicWriter, StopSequence) {
  const BothModes r = RunBothModes({Text("one two"), Finished(FinishReason::kStop, "three")});
  EXPECT_EQ(r.body["stop_reason"], "stop_sequence");
  EXPECT_EQ(r.body["stop_sequence"], "three");
}

TEST(AnthropicWriter, MaxTokens) {
  const BothModes r = RunBothModes({Reasoning("still thinking"), Finished(FinishReason::kLength)});
  EXPECT_EQ(r.body["stop_reason"], "max_tokens");
  EXPECT_TRUE(r.body["stop_sequence"].is_null());
  EXPECT_EQ(r.body["content"].size(), 1u);
  EXPECT_EQ(r.body["content"][0]["type"], "thinking");
}

TEST(AnthropicWriter, EmptyAnswer) {
  const BothModes r = RunBothModes({Finished(FinishReason::kStop)});
  EXPECT_EQ(r.body["content"], Json::array());
  EXPECT_EQ(r.body["stop_reason"], "end_turn");
  EXPECT_EQ(r.sse.find("content_block_start"), std::string::npos);
}

TEST(AnthropicWriter, ErrorEndsTheStreamWithAnErrorEvent) {
  ChatEvent failed = Finished(FinishReason::kError);
  failed.error = "the engine failed";
  ResponseWriter streamed("msg_test", "tiny");
  std::string sse = streamed.Events(Text("partial"));
  sse += streamed.Events(failed);
  EXPECT_NE(sse.find("event: content_block_stop"), std::string::npos);  // the text block closed
  const size_t error_at = sse.find("event: error\ndata: ");
  ASSERT_NE(error_at, std::string::npos) << sse;
  const Json error = Json::parse(sse.substr(error_at + 19));
  EXPECT_EQ(error["type"], "error");
  EXPECT_EQ(error["error"]["type"], "api_error");
  EXPECT_EQ(error["error"]["message"], "the engine failed");
  EXPECT_EQ(sse.find("message_stop"), std::string::npos);
  EXPECT_EQ(streamed.Events(Text("late")), "");  // nothing after the end

  ResponseWriter whole("msg_test", "tiny");
  whole.Add(Text("partial"));
  whole.Add(failed);
  EXPECT_EQ(Json::parse(whole.Body())["error"]["message"], "the engine failed");
}

TEST(AnthropicWriter, BadUtf8InTextIsReplacedNotThrown) {
  const BothModes r = RunBothModes({Text("a\xe2\x82"), Text("b"), Finished(FinishReason::kStop)});
  const std::string text = r.body["content"][0]["text"];
  EXPECT_EQ(text.front(), 'a');
  EXPECT_EQ(text.back(), 'b');
}

// Arguments that are no JSON object: the message still holds an object, as the API requires.
TEST(AnthropicWriter, UnparsableArgumentsGiveAnEmptyInput) {
  const std::string too_deep = std::string(1000, '[') + std::string(1000, ']');
  for (const std::string args : {"[1]", "{\"a\": ", "", too_deep.c_str()}) {
    ResponseWriter whole("m", "tiny");
    whole.Add(ToolEvent(ChatEvent::Kind::kToolCallBegin, 0, "call_x", "f", ""));
    whole.Add(ToolEvent(ChatEvent::Kind::kToolCallEnd, 0, "call_x", "f", args));
    whole.Add(Finished(FinishReason::kToolCalls));
    const Json block = Json::parse(whole.Body())["content"][0];
    EXPECT_EQ(block["type"], "tool_use");
    EXPECT_EQ(block["input"], Json::object()) << args;
  }
}

}  // namespace
}  // namespace moetier::server::anthropic
