// Fuzz target: arbitrary bytes as a POST /v1/messages body (and as a count_tokens body). Must
// never crash or throw: a body either parses or fails with a 400 naming a field, and the error
// body is valid JSON. A body that parses is then played back through the response writer (its
// texts and tool calls as the answer's events), whose message and stream must be valid JSON too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/anthropic_api.h"

namespace {

using moetier::server::ChatEvent;
using moetier::server::ChatRequest;
using moetier::server::FinishReason;
namespace anthropic = moetier::server::anthropic;

void Check(bool ok) {
  if (!ok) std::abort();
}

ChatEvent Event(ChatEvent::Kind kind, std::string text, int tool_index = 0,
                moetier::server::ToolCall call = {}) {
  ChatEvent e;
  e.kind = kind;
  e.text = std::move(text);
  e.tool_index = tool_index;
  e.tool_call = std::move(call);
  return e;
}

// The request's own strings as an answer: reasoning, content and tool calls, then the end.
std::vector<ChatEvent> EventsFrom(const ChatRequest& request) {
  using Kind = ChatEvent::Kind;
  std::vector<ChatEvent> events;
  int tool_index = 0;
  for (const auto& m : request.messages) {
    events.push_back(Event(Kind::kReasoning, m.reasoning_content));
    events.push_back(Event(Kind::kContent, m.content));
    for (const auto& call : m.tool_calls) {
      const std::string half = call.arguments.substr(0, call.arguments.size() / 2);
      events.push_back(Event(Kind::kToolCallBegin, "", tool_index, call));
      events.push_back(Event(Kind::kToolCallArgs, half, tool_index));
      events.push_back(Event(Kind::kToolCallEnd, "", tool_index, call));
      ++tool_index;
    }
  }
  ChatEvent finished = Event(Kind::kFinished, "");
  finished.finish_reason = tool_index > 0 ? FinishReason::kToolCalls : FinishReason::kStop;
  if (!request.sampling.stop.empty()) finished.stop_sequence = request.sampling.stop.front();
  events.push_back(finished);
  return events;
}

// Every event of an SSE stream is "event: NAME\ndata: JSON\n\n"; a "data: " inside a JSON string
// (escaped, on the same line) is not an event.
void CheckStream(const std::string& sse) {
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    Check(end != std::string::npos);
    const std::string_view event(sse.data() + at, end - at);
    Check(event.substr(0, 7) == "event: ");
    const size_t data = event.find("\ndata: ");
    Check(data != std::string_view::npos);
    Check(event.substr(7, data - 7).find('\n') == std::string_view::npos);
    Check(nlohmann::json::accept(event.substr(data + 7)));
    at = end + 2;
  }
}

void PlayBack(const ChatRequest& request) {
  anthropic::ResponseWriter whole("msg_fuzz", request.model);
  anthropic::ResponseWriter streamed("msg_fuzz", request.model);
  std::string sse;
  for (const ChatEvent& e : EventsFrom(request)) {
    whole.Add(e);
    sse += streamed.Events(e);
  }
  Check(nlohmann::json::accept(whole.Body()));
  CheckStream(sse);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const bool count_tokens : {false, true}) {
    moetier::server::RequestError error;
    auto parsed = anthropic::ParseRequest(body, count_tokens, &error);
    if (!parsed.ok()) {
      Check(error.http_status == 400 && !error.param.empty());
      Check(nlohmann::json::accept(anthropic::ErrorBody(error)));
      continue;
    }
    PlayBack(parsed->request);
  }
  return 0;
}
