// Fuzz target: arbitrary bytes as a POST /v1/chat/completions body and as a /v1/completions
// body. Must never crash or throw: a body either parses or fails with a 400 naming a field, and
// the error body is valid JSON. A body that parses is played back through the response writer
// (its messages' texts and tool calls as the answer's events), whose SSE chunks and whole
// response must be valid JSON too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_api.h"

namespace {

using moetier::server::ChatEvent;
using moetier::server::ChatRequest;
using moetier::server::FinishReason;
namespace openai = moetier::server::openai;

void Check(bool ok) {
  if (!ok) std::abort();
}

// The request's own strings as an answer: reasoning, content, tool calls, then the end.
std::vector<ChatEvent> EventsFrom(const ChatRequest& request) {
  using Kind = ChatEvent::Kind;
  std::vector<ChatEvent> events;
  auto add = [&](Kind kind, std::string text) {
    ChatEvent e;
    e.kind = kind;
    e.text = std::move(text);
    events.push_back(std::move(e));
  };
  add(Kind::kContent, request.prompt);
  int index = 0;
  for (const auto& m : request.messages) {
    add(Kind::kReasoning, m.reasoning_content);
    add(Kind::kContent, m.content);
    for (const auto& call : m.tool_calls) {
      ChatEvent begin;
      begin.kind = Kind::kToolCallBegin;
      begin.tool_index = index;
      begin.tool_call = call;
      events.push_back(begin);
      // Half the arguments streamed, the rest left to the end.
      ChatEvent args = begin;
      args.kind = Kind::kToolCallArgs;
      args.text = call.arguments.substr(0, call.arguments.size() / 2);
      events.push_back(args);
      ChatEvent end = begin;
      end.kind = Kind::kToolCallEnd;
      events.push_back(end);
      ++index;
    }
  }
  ChatEvent done;
  done.kind = Kind::kFinished;
  done.finish_reason = index > 0 ? FinishReason::kToolCalls : FinishReason::kStop;
  done.usage.prompt_tokens = static_cast<int64_t>(request.messages.size());
  events.push_back(done);
  return events;
}

// Every "data: " line of an SSE stream is JSON or [DONE], and [DONE] ends it.
void CheckStream(const std::string& sse) {
  size_t at = 0;
  bool done = false;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    Check(end != std::string::npos && !done);
    const std::string_view line(sse.data() + at, end - at);
    Check(line.substr(0, 6) == "data: ");
    if (line == "data: [DONE]") {
      done = true;
    } else {
      Check(nlohmann::json::accept(line.substr(6)));
    }
    at = end + 2;
  }
  Check(done);
}

void RunOne(openai::Endpoint endpoint, std::string_view body) {
  moetier::server::RequestError error;
  auto parsed = openai::ParseRequest(endpoint, body, &error);
  if (!parsed.ok()) {
    Check(error.http_status == 400 && !error.message.empty());
    Check(nlohmann::json::accept(openai::ErrorBody(error)));
    return;
  }
  const std::vector<ChatEvent> events = EventsFrom(parsed->request);
  openai::ResponseWriter stream(endpoint, "chatcmpl-fuzz", parsed->request.model, 0,
                                parsed->include_usage);
  openai::ResponseWriter whole(endpoint, "chatcmpl-fuzz", parsed->request.model, 0, false);
  std::string sse;
  for (const ChatEvent& e : events) {
    sse += stream.Chunk(e);
    whole.Add(e);
  }
  CheckStream(sse);
  Check(nlohmann::json::accept(whole.Body()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  RunOne(openai::Endpoint::kChatCompletions, body);
  RunOne(openai::Endpoint::kCompletions, body);
  return 0;
}
