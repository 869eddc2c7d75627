// The OpenAI API's JSON both ways: every request field parsed into a ChatRequest, every bad
// field refused with a 400 that names it, and the response objects and SSE chunks for scripted
// event sequences (content, reasoning, tool calls, usage, [DONE]).
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace moetier::server::openai {
namespace {

using Json = nlohmann::json;

ParsedRequest ParseOk(const std::string& body, Endpoint e = Endpoint::kChatCompletions) {
  RequestError error;
  auto p = ParseRequest(e, body, &error);
  EXPECT_TRUE(p.ok()) << body << " -> " << error.message;
  return p.ok() ? std::move(p).value() : ParsedRequest{};
}

// The refusal of `body`: its param (and the message must name it).
RequestError ParseError(const std::string& body, Endpoint e = Endpoint::kChatCompletions) {
  RequestError error;
  auto p = ParseRequest(e, body, &error);
  EXPECT_FALSE(p.ok()) << body;
  EXPECT_EQ(error.http_status, 400) << body;
  EXPECT_FALSE(error.message.empty()) << body;
  if (!error.param.empty()) {
    EXPECT_NE(error.message.find(error.param), std::string::npos) << error.message;
  }
  return error;
}

constexpr const char* kHello = R"("messages": [{"role": "user", "content": "hi"}])";

std::string Chat(const std::string& extra) {
  return std::string("{") + kHello + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(OpenAiParse, EverySamplingField) {
  const ParsedRequest p = ParseOk(Chat(
      R"("model": "m", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
         "min_p": 0.05, "seed": 1234, "stop": ["END", "", "STOP"], "presence_penalty": 1.5,
         "frequency_penalty": -0.5, "repetition_penalty": 1.1, "stream": true,
         "stream_options": {"include_usage": true}, "n": 1, "response_format": {"type": "text"},
         "unknown_field": {"anything": [1, 2]}, "user": "someone")"));
  const SamplingParams& s = p.request.sampling;
  EXPECT_EQ(p.request.model, "m");
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"END", "STOP"}));  // empty strings dropped
  EXPECT_FLOAT_EQ(s.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_FALSE(p.request.raw_prompt);
}

TEST(OpenAiParse, DefaultsAndAlternativeSpellings) {
  ParsedRequest p = ParseOk(Chat(R"("temperature": null, "stop": "x", "top_k": -1)"));
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 1.0f);  // null is absent
  EXPECT_FALSE(p.request.sampling.max_tokens.has_value());
  EXPECT_EQ(p.request.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(p.request.sampling.top_k, 0);  // -1: off
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.include_usage);
  // max_completion_tokens wins over the older max_tokens.
  p = ParseOk(Chat(R"("max_tokens": 50, "max_completion_tokens": 5)"));
  EXPECT_EQ(p.request.sampling.max_tokens, 5);
  // Any 64-bit seed, signed or not (OpenAI documents no range).
  p = ParseOk(Chat(R"("seed": 18446744073709551615)"));
  EXPECT_EQ(p.request.sampling.seed, UINT64_MAX);
  p = ParseOk(Chat(R"("seed": -2)"));
  EXPECT_EQ(p.request.sampling.seed, UINT64_MAX - 1);
}

TEST(OpenAiParse, MessagesOfEveryRole) {
  const ParsedRequest p = ParseOk(R"({"messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get", "content": "42"},
      {"role": "assistant", "content": "done"}]})");
  const auto& m = p.request.messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].role, ChatMessage::Role::kSystem);
  EXPECT_EQ(m[0].content, "be brief");
  EXPECT_EQ(m[1].role, ChatMessage::Role::kUser);
  EXPECT_EQ(m[1].content, "ab");
  EXPECT_EQ(m[2].role, ChatMessage::Role::kAssistant);
  EXPECT_EQ(m[2].content, "");
  EXPECT_EQ(m[2].reasoning_content, "hmm");
  ASSERT_EQ(m[2].tool_calls.size(), 1u);
  EXPECT_EQ(m[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(m[2].tool_calls[0].name, "get");
  EXPECT_EQ(Json::parse(m[2].tool_calls[0].arguments), Json::parse(R"({"x": 1})"));
  EXPECT_EQ(m[3].role, ChatMessage::Role::kTool);
  EXPECT_EQ(m[3].tool_call_id, "call_1");
  EXPECT_EQ(m[3].name, "get");
  EXPECT_EQ(m[3].content, "42");
  EXPECT_EQ(m[4].content, "done");
}

TEST(OpenAiParse, ToolsAndToolChoice) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather",
          "description": "Weather now", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
          {"type": "function", "function": {"name": "noop"}}])";
  ParsedRequest p = ParseOk(Chat(tools + R"(, "parallel_tool_calls": false)"));
  ASSERT_EQ(p.request.tools.size(), 2u);
  EXPECT_EQ(p.request.tools[0].name, "get_weather");
  EXPECT_EQ(p.request.tools[0].description, "Weather now");
  EXPECT_EQ(p.request.tools[0].parameters["required"][0], "city");
  // Key order of the schema is kept (the template renders it as given).
  EXPECT_EQ(p.request.tools[0].parameters.begin().key(), "type");
  EXPECT_TRUE(p.request.tools[1].parameters.is_object());
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kAuto);
  EXPECT_FALSE(p.request.parallel_tool_calls);
  for (const auto& [text, choice] : std::vector<std::pair<std::string, ToolChoice>>{
           {"\"auto\"", ToolChoice::kAuto},
           {"\"none\"", ToolChoice::kNone},
           {"\"required\"", ToolChoice::kRequired},
           {R"({"type": "function", "function": {"name": "noop"}})", ToolChoice::kNamed}}) {
    p = ParseOk(Chat(tools + ", \"tool_choice\": " + text));
    EXPECT_EQ(p.request.tool_choice, choice) << text;
  }
  EXPECT_EQ(p.request.tool_choice_name, "noop");
  EXPECT_EQ(ParseError(Chat(tools + R"(, "tool_choice": {"type": "function",
      "function": {"name": "missing"}})"))
                .param,
            "tool_choice.function.name");
  EXPECT_EQ(ParseError(Chat(R"("tool_choice": "required")")).param, "tool_choice");
  EXPECT_EQ(ParseError(Chat(tools + R"(, "tool_choice": "sometimes")")).param, "tool_choice");
}

TEST(OpenAiParse, ChatTemplateKwargs) {
  const ParsedRequest p = ParseOk(Chat(R"("chat_template_kwargs": {"enable_thinking": false})"));
  ASSERT_TRUE(p.request.template_kwargs.is_object());
  EXPECT_EQ(p.request.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(ParseError(Chat(R"("chat_template_kwargs": [1])")).param, "chat_template_kwargs");
}

TEST(OpenAiParse, EveryBadFieldIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("temperature": 2.5)", "temperature"},
      {R"("temperature": -0.1)", "temperature"},
      {R"("temperature": "hot")", "temperature"},
      {R"("top_p": 0)", "top_p"},
      {R"("top_p": 1.5)", "top_p"},
      {R"("top_k": 1.5)", "top_k"},
      {R"("top_k": -2)", "top_k"},
      {R"("min_p": 2)", "min_p"},
      {R"("seed": "x")", "seed"},
      {R"("seed": 1e300)", "seed"},
      {R"("max_tokens": 0)", "max_tokens"},
      {R"("max_tokens": 99999999999999999999999)", "max_tokens"},
      {R"("max_completion_tokens": -5)", "max_completion_tokens"},
      {R"("presence_penalty": 2.01)", "presence_penalty"},
      {R"("frequency_penalty": -3)", "frequency_penalty"},
      {R"("repetition_penalty": 0)", "repetition_penalty"},
      {R"("stop": 5)", "stop"},
      {R"("stop": ["a", 1])", "stop"},
      {R"("stream": "yes")", "stream"},
      {R"("stream_options": {"include_usage": 1})", "stream_options.include_usage"},
      {R"("n": 2)", "n"},
      {R"("response_format": {"type": "json_object"})", "response_format"},
      {R"("logprobs": 1)", "logprobs"},
      {R"("logprobs": true, "top_logprobs": 21)", "top_logprobs"},
      {R"("logprobs": true, "top_logprobs": -1)", "top_logprobs"},
      {R"("top_logprobs": 2)", "top_logprobs"},
      {R"("logprobs": false, "top_logprobs": 0)", "top_logprobs"},
      {R"("logit_bias": [1, 2])", "logit_bias"},
      {R"("logit_bias": {"a": 1})", "logit_bias"},
      {R"("logit_bias": {"-1": 1})", "logit_bias"},
      {R"("logit_bias": {"99999999999": 1})", "logit_bias"},
      {R"("logit_bias": {"42": 100.5})", "logit_bias"},
      {R"("logit_bias": {"42": "5"})", "logit_bias"},
      {R"("parallel_tool_calls": 1)", "parallel_tool_calls"},
      {R"("model": 5)", "model"},
      {R"("tools": {"a": 1})", "tools"},
      {R"("tools": [{"type": "function", "function": {"name": ""}}])", "tools[0].function.name"},
      {R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])",
       "tools[0].function.parameters"},
  };
  for (const auto& [field, param] : cases) EXPECT_EQ(ParseError(Chat(field)).param, param) << field;
}

TEST(OpenAiParse, BadMessagesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [5]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
       "messages[0].content[0].text"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "x"}]})",
       "messages[1].tool_call_id"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c",
          "function": {"name": "f", "arguments": 5}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})",
       "messages[0].tool_calls[0].function.name"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(ParseError(body).param, param) << body;
}

TEST(OpenAiParse, MalformedBodiesAreRefusedNotCrashed) {
  for (const std::string& body :
       {std::string(""), std::string("{"), std::string("[1, 2]"), std::string("null"),
        std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"),
        std::string("{\"messages\": 1e99999}"), std::string(100000, '['),
        std::string("{\"a\": \"\\ud800\"}")}) {
    RequestError error;
    auto p = ParseRequest(Endpoint::kChatCompletions, body, &error);
    EXPECT_FALSE(p.ok());
    EXPECT_EQ(error.http_status, 400);
  }
}

TEST(OpenAiParse, Completions) {
  ParsedRequest p = ParseOk(R"({"prompt": "Once upon", "temperature": 0, "stop": ["\n"],
                                "stream": true})",
                            Endpoint::kCompletions);
  EXPECT_TRUE(p.request.raw_prompt);
  EXPECT_EQ(p.request.prompt, "Once upon");
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 0.0f);
  EXPECT_EQ(p.request.sampling.max_tokens, 16);  // OpenAI's default for completions
  p = ParseOk(R"({"prompt": ["x"], "max_tokens": 3})", Endpoint::kCompletions);
  EXPECT_EQ(p.request.prompt, "x");
  EXPECT_EQ(p.request.sampling.max_tokens, 3);
  // Token ids, alone or as a list of one list (one prompt a request).
  p = ParseOk(R"({"prompt": [1, 2, 151935]})", Endpoint::kCompletions);
  EXPECT_EQ(p.request.prompt_ids, (std::vector<int32_t>{1, 2, 151935}));
  EXPECT_TRUE(p.request.prompt.empty());
  EXPECT_EQ(ParseOk(R"({"prompt": [[7, 8]]})", Endpoint::kCompletions).request.prompt_ids,
            (std::vector<int32_t>{7, 8}));
  for (const char* bad :
       {R"({"prompt": []})", R"({"prompt": [[1], [2]]})", R"({"prompt": [-1]})",
        R"({"prompt": [1.5]})", R"({"prompt": [4294967296]})", R"({"prompt": ["a", "b"]})",
        R"({"prompt": [1, "a"]})", R"({"prompt": [[]]})"})
    EXPECT_EQ(ParseError(bad, Endpoint::kCompletions).param, "prompt") << bad;
  EXPECT_EQ(ParseError(R"({})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "n": 3})", Endpoint::kCompletions).param, "n");
}

TEST(OpenAiParse, Logprobs) {
  EXPECT_EQ(ParseOk(Chat("")).request.top_logprobs, -1);
  EXPECT_EQ(ParseOk(Chat(R"("logprobs": false)")).request.top_logprobs, -1);
  EXPECT_EQ(ParseOk(Chat(R"("logprobs": true)")).request.top_logprobs, 0);
  EXPECT_EQ(ParseOk(Chat(R"("logprobs": true, "top_logprobs": 20)")).request.top_logprobs, 20);
  EXPECT_EQ(ParseOk(Chat(R"("logprobs": null, "top_logprobs": null, "logit_bias": {})"))
                .request.top_logprobs,
            -1);
  constexpr Endpoint kC = Endpoint::kCompletions;
  EXPECT_EQ(ParseOk(R"({"prompt": "x"})", kC).request.top_logprobs, -1);
  EXPECT_EQ(ParseOk(R"({"prompt": "x", "logprobs": 0})", kC).request.top_logprobs, 0);
  EXPECT_EQ(ParseOk(R"({"prompt": "x", "logprobs": 5, "echo": false, "best_of": 1,
                        "suffix": ""})",
                    kC)
                .request.top_logprobs,
            5);
  EXPECT_EQ(ParseError(R"({"prompt": "x", "logprobs": true})", kC).param, "logprobs");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "logprobs": 21})", kC).param, "logprobs");
  EXPECT_TRUE(ParseOk(R"({"prompt": "x", "echo": true, "logprobs": 1})", kC).request.echo);
  EXPECT_FALSE(ParseOk(R"({"prompt": "x"})", kC).request.echo);
  EXPECT_EQ(ParseError(R"({"prompt": "x", "echo": 1})", kC).param, "echo");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "best_of": 2})", kC).param, "best_of");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "suffix": "end"})", kC).param, "suffix");
}

// logit_bias: token ids as an object's keys, biases in [-100, 100], on both endpoints.
TEST(OpenAiParse, LogitBias) {
  EXPECT_TRUE(ParseOk(Chat("")).request.sampling.logit_bias.empty());
  EXPECT_TRUE(ParseOk(Chat(R"("logit_bias": {})")).request.sampling.logit_bias.empty());
  const auto bias = ParseOk(Chat(R"("logit_bias": {"42": 100, "7": -100, "0": 2.5})"))
                        .request.sampling.logit_bias;
  const std::vector<std::pair<int32_t, float>> want = {{42, 100.0f}, {7, -100.0f}, {0, 2.5f}};
  EXPECT_EQ(bias, want);
  EXPECT_EQ(ParseOk(R"({"prompt": "x", "logit_bias": {"1": -100}})", Endpoint::kCompletions)
                .request.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{1, -100.0f}}));
}

TEST(OpenAiErrors, ShapeAndTypes) {
  Json j = Json::parse(ErrorBody(RequestError{400, "temperature: too hot", "temperature"}));
  EXPECT_EQ(j["error"]["message"], "temperature: too hot");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"].contains("code"));
  j = Json::parse(ErrorBody(RequestError{503, "busy", ""}));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(j["error"]["type"], "server_error");
}

// ---- responses ---------------------------------------------------------------------------

ChatEvent Text(ChatEvent::Kind kind, std::string text) {
  ChatEvent e;
  e.kind = kind;
  e.text = std::move(text);
  return e;
}

ChatEvent CallBegin(int index, std::string id, std::string name) {
  ChatEvent e;
  e.kind = ChatEvent::Kind::kToolCallBegin;
  e.tool_index = index;
  e.tool_call.id = std::move(id);
  e.tool_call.name = std::move(name);
  return e;
}

ChatEvent CallArgs(int index, std::string text) {
  ChatEvent e = Text(ChatEvent::Kind::kToolCallArgs, std::move(text));
  e.tool_index = index;
  return e;
}

ChatEvent CallEnd(int index, std::string id, std::string name, std::string args) {
  ChatEvent e;
  e.kind = ChatEvent::Kind::kToolCallEnd;
  e.tool_index = index;
  e.tool_call = ToolCall{std::move(id), std::move(name), std::move(args)};
  return e;
}

ChatEvent Finished(FinishReason reason) {
  ChatEvent e;
  e.kind = ChatEvent::Kind::kFinished;
  e.finish_reason = reason;
  e.usage = ChatUsage{10, 4, 6};
  return e;
}

// The JSON objects of an SSE stream, and whether it ended with [DONE].
std::vector<Json> SseObjects(const std::string& sse, bool* done) {
  std::vector<Json> out;
  *done = false;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event not ended by a blank line";
    if (end == std::string::npos) break;
    const std::string line = sse.substr(at, end - at);
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    EXPECT_FALSE(*done) << "data after [DONE]";
    if (line == "data: [DONE]")
      *done = true;
    else
      out.push_back(Json::parse(line.substr(6)));
    at = end + 2;
  }
  return out;
}

std::vector<ChatEvent> ScriptedAnswer() {
  return {Text(ChatEvent::Kind::kReasoning, "think "), Text(ChatEvent::Kind::kReasoning, "hard"),
          Text(ChatEvent::Kind::kContent, "Hello"), Text(ChatEvent::Kind::kContent, " there"),
          CallBegin(0, "call_a", "get"), CallArgs(0, "{\"x\":"), CallArgs(0, " 1}"),
          CallEnd(0, "call_a", "get", "{\"x\": 1}"), CallBegin(1, "call_b", "put"),
          // The args of call 1 arrive whole at its end.
          CallEnd(1, "call_b", "put", "{}"), Finished(FinishReason::kToolCalls)};
}

TEST(OpenAiWriter, StreamedChatChunks) {
  ResponseWriter w(Endpoint::kChatCompletions, "chatcmpl-1", "tiny", 1700000000, true);
  std::string sse;
  for (const ChatEvent& e : ScriptedAnswer()) sse += w.Chunk(e);
  bool done = false;
  const std::vector<Json> chunks = SseObjects(sse, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  std::string reasoning, content;
  std::vector<Json> calls;
  std::string finish;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    const Json& c = chunks[i];
    EXPECT_EQ(c["id"], "chatcmpl-1");
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["created"], 1700000000);
    EXPECT_EQ(c["model"], "tiny");
    EXPECT_TRUE(c["usage"].is_null());
    ASSERT_EQ(c["choices"].size(), 1u);
    const Json& choice = c["choices"][0];
    EXPECT_EQ(choice["index"], 0);
    EXPECT_TRUE(choice["logprobs"].is_null());
    const Json& d = choice["delta"];
    if (i == 0) {
      EXPECT_EQ(d["role"], "assistant");
    } else {
      EXPECT_FALSE(d.contains("role"));
    }
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const Json& t : d["tool_calls"]) calls.push_back(t);
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(reasoning, "think hard");
  EXPECT_EQ(content, "Hello there");
  EXPECT_EQ(finish, "tool_calls");
  // The first fragment of a call carries id, type and name; the rest only arguments.
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["id"], "call_a");
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get");
  std::string args0;
  for (int i = 0; i < 3; ++i) {
    if (i > 0) {
      EXPECT_FALSE(calls[i].contains("id"));
      EXPECT_FALSE(calls[i]["function"].contains("name"));
    }
    args0 += calls[i]["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(args0, "{\"x\": 1}");
  EXPECT_EQ(calls[3]["id"], "call_b");
  EXPECT_EQ(calls[3]["index"], 1);
  EXPECT_EQ(calls[4]["index"], 1);
  EXPECT_EQ(calls[4]["function"]["arguments"], "{}");
  // The usage chunk: no choices, the usage with cached tokens.
  const Json& last = chunks.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(last["usage"]["completion_tokens"], 6);
  EXPECT_EQ(last["usage"]["total_tokens"], 16);
  EXPECT_EQ(last["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(OpenAiWriter, StreamWithoutUsageEndsWithFinishThenDone) {
  ResponseWriter w(Endpoint::kChatCompletions, "chatcmpl-2", "tiny", 1, false);
  std::string sse = w.Chunk(Text(ChatEvent::Kind::kContent, "ab"));
  sse += w.Chunk(Text(ChatEvent::Kind::kContent, ""));  // nothing to send
  sse += w.Chunk(Finished(FinishReason::kLength));
  bool done = false;
  const std::vector<Json> chunks = SseObjects(sse, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(chunks.size(), 3u);  // role, "ab", finish
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "ab");
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(chunks[2]["choices"][0]["delta"].empty());
  for (const Json& c : chunks) EXPECT_FALSE(c.contains("usage"));
}

TEST(OpenAiWriter, StreamedErrorIsAnErrorObject) {
  ResponseWriter w(Endpoint::kChatCompletions, "chatcmpl-3", "tiny", 1, false);
  ChatEvent e = Finished(FinishReason::kError);
  e.error = "the model computed a non-finite value";
  bool done = false;
  const std::vector<Json> chunks = SseObjects(w.Chunk(e), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["error"]["message"], "the model computed a non-finite value");
}

TEST(OpenAiWriter, WholeChatCompletion) {
  ResponseWriter w(Endpoint::kChatCompletions, "chatcmpl-4", "tiny", 42, false);
  for (const ChatEvent& e : ScriptedAnswer()) w.Add(e);
  const Json j = Json::parse(w.Body());
  EXPECT_EQ(j["id"], "chatcmpl-4");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 42);
  EXPECT_EQ(j["model"], "tiny");
  const Json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hello there");
  EXPECT_EQ(c["message"]["reasoning_content"], "think hard");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(c["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_EQ(c["message"]["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["usage"]["total_tokens"], 16);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(OpenAiWriter, ToolCallsOnlyHaveNullContent) {
  ResponseWriter w(Endpoint::kChatCompletions, "chatcmpl-5", "tiny", 1, false);
  w.Add(CallBegin(0, "call_a", "get"));
  w.Add(CallEnd(0, "call_a", "get", "{}"));
  w.Add(Finished(FinishReason::kToolCalls));
  const Json j = Json::parse(w.Body());
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null());
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));
}

TEST(OpenAiWriter, TextCompletion) {
  ResponseWriter w(Endpoint::kCompletions, "cmpl-1", "tiny", 7, true);
  std::string sse = w.Chunk(Text(ChatEvent::Kind::kContent, "Once"));
  sse += w.Chunk(Text(ChatEvent::Kind::kContent, " upon"));
  ChatEvent fin = Finished(FinishReason::kStop);
  fin.stop_sequence = "\n";
  sse += w.Chunk(fin);
  bool done = false;
  const std::vector<Json> chunks = SseObjects(sse, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(chunks.size(), 4u);  // two texts, the finish, the usage
  EXPECT_EQ(chunks[0]["object"], "text_completion");
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "Once");
  EXPECT_TRUE(chunks[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[3]["usage"]["total_tokens"], 16);

  ResponseWriter whole(Endpoint::kCompletions, "cmpl-2", "tiny", 7, false);
  whole.Add(Text(ChatEvent::Kind::kContent, "Once"));
  whole.Add(Text(ChatEvent::Kind::kContent, " upon"));
  whole.Add(Finished(FinishReason::kLength));
  const Json j = Json::parse(whole.Body());
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Once upon");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

}  // namespace
}  // namespace moetier::server::openai

namespace moetier::server::openai {
namespace {

ChatEvent Logprobs(std::string token, float logprob, std::vector<TokenText> top) {
  ChatEvent e;
  e.kind = ChatEvent::Kind::kLogprobs;
  e.logprobs.chosen = TokenText{std::move(token), logprob};
  e.logprobs.top = std::move(top);
  return e;
}

// Two tokens give "Hi", a third (the end token) none; "\xC3" is half of "é" (its second byte a
// token of its own): every token's entry lands in the chunk that carries its text, or in the
// finish chunk.
std::vector<ChatEvent> AnswerWithLogprobs() {
  const float kInf = std::numeric_limits<float>::infinity();
  return {Logprobs("H", -0.5f, {{"H", -0.5f}, {"A", -1.5f}}),
          Logprobs("i", -0.25f, {{"i", -0.25f}, {"\xC3", -2.0f}}),
          Text(ChatEvent::Kind::kContent, "Hi"),
          Logprobs("<end>", -kInf, {{"!", -0.1f}, {"?", -3.0f}}), Finished(FinishReason::kStop)};
}

TEST(OpenAiWriter, ChatLogprobs) {
  ResponseWriter whole(Endpoint::kChatCompletions, "chatcmpl-6", "tiny", 1, false, true);
  for (const ChatEvent& e : AnswerWithLogprobs()) whole.Add(e);
  const Json j = Json::parse(whole.Body());
  const Json& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << j.dump();
  EXPECT_TRUE(lp["refusal"].is_null());
  ASSERT_EQ(lp["content"].size(), 3u);
  EXPECT_EQ(lp["content"][0]["token"], "H");
  EXPECT_DOUBLE_EQ(lp["content"][0]["logprob"].get<double>(), -0.5);
  EXPECT_EQ(lp["content"][0]["bytes"], Json::array({72}));
  ASSERT_EQ(lp["content"][1]["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp["content"][1]["top_logprobs"][1]["bytes"], Json::array({0xC3}));
  EXPECT_EQ(lp["content"][1]["top_logprobs"][1]["token"], "\xEF\xBF\xBD") << "U+FFFD";
  EXPECT_DOUBLE_EQ(lp["content"][2]["logprob"].get<double>(), -9999.0);

  ResponseWriter stream(Endpoint::kChatCompletions, "chatcmpl-7", "tiny", 1, false, true);
  std::string sse;
  for (const ChatEvent& e : AnswerWithLogprobs()) sse += stream.Chunk(e);
  bool done = false;
  const std::vector<Json> chunks = SseObjects(sse, &done);
  ASSERT_EQ(chunks.size(), 3u);  // the role, "Hi", the finish
  EXPECT_TRUE(chunks[0]["choices"][0]["logprobs"].is_null());
  const Json& hi = chunks[1]["choices"][0];
  EXPECT_EQ(hi["delta"]["content"], "Hi");
  ASSERT_EQ(hi["logprobs"]["content"].size(), 2u);
  EXPECT_EQ(hi["logprobs"]["content"][1]["token"], "i");
  const Json& fin = chunks[2]["choices"][0];
  EXPECT_EQ(fin["finish_reason"], "stop");
  ASSERT_EQ(fin["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(fin["logprobs"]["content"][0]["token"], "<end>");

  ResponseWriter none(Endpoint::kChatCompletions, "chatcmpl-8", "tiny", 1, false, false);
  for (const ChatEvent& e : AnswerWithLogprobs()) none.Add(e);
  EXPECT_TRUE(Json::parse(none.Body())["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiWriter, CompletionLogprobs) {
  ResponseWriter whole(Endpoint::kCompletions, "cmpl-3", "tiny", 1, false, true);
  for (const ChatEvent& e : AnswerWithLogprobs()) whole.Add(e);
  const Json j = Json::parse(whole.Body());
  const Json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json::array({"H", "i", "<end>"}));
  EXPECT_EQ(lp["token_logprobs"], Json::array({-0.5, -0.25, -9999.0}));
  EXPECT_EQ(lp["text_offset"], Json::array({0, 1, 2}));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][0]["A"].get<double>(), -1.5);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][2]["?"].get<double>(), -3.0);

  ResponseWriter stream(Endpoint::kCompletions, "cmpl-4", "tiny", 1, false, true);
  std::string sse;
  for (const ChatEvent& e : AnswerWithLogprobs()) sse += stream.Chunk(e);
  bool done = false;
  const std::vector<Json> chunks = SseObjects(sse, &done);
  ASSERT_EQ(chunks.size(), 2u);  // "Hi", the finish
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["tokens"], Json::array({"H", "i"}));
  EXPECT_EQ(chunks[1]["choices"][0]["logprobs"]["tokens"], Json::array({"<end>"}));
  EXPECT_EQ(chunks[1]["choices"][0]["logprobs"]["text_offset"], Json::array({2}));
}

// An echoed prompt's first token has no log-probability: null, and null alternatives.
TEST(OpenAiWriter, EchoedPromptsFirstTokenIsNull) {
  ResponseWriter w(Endpoint::kCompletions, "cmpl-5", "tiny", 1, false, true);
  w.Add(Logprobs("Once", std::numeric_limits<float>::quiet_NaN(), {}));
  w.Add(Logprobs(" upon", -2.5f, {{" upon", -2.5f}}));
  w.Add(Text(ChatEvent::Kind::kContent, "Once upon"));
  w.Add(Logprobs(" a", -0.5f, {{" a", -0.5f}}));
  w.Add(Text(ChatEvent::Kind::kContent, " a"));
  w.Add(Finished(FinishReason::kLength));
  const Json j = Json::parse(w.Body());
  const Json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(j["choices"][0]["text"], "Once upon a");
  EXPECT_EQ(lp["tokens"], Json::array({"Once", " upon", " a"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -2.5);
  EXPECT_EQ(lp["text_offset"], Json::array({0, 4, 9}));
}

}  // namespace
}  // namespace moetier::server::openai
