// The Anthropic Messages API's JSON, both ways: POST /v1/messages (and
// /v1/messages/count_tokens) bodies into a ChatRequest (system as a string or text blocks;
// content as a string or blocks: text, tool_use, tool_result, thinking; tools with
// input_schema; tool_choice auto/any/tool/none; thinking {"type": "enabled"} → the template's
// enable_thinking), and ChatEvents into a message object or the streaming events
// (message_start, content_block_start/delta/stop with text_delta, thinking_delta and
// input_json_delta, message_delta with stop_reason end_turn/max_tokens/stop_sequence/tool_use
// and usage, message_stop). Errors in Anthropic's shape:
// {"type": "error", "error": {"type", "message"}}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "server/chat_service.h"
#include "server/chat_types.h"

namespace moetier::server::anthropic {

struct ParsedRequest {
  ChatRequest request;
  bool stream = false;
};

// A /v1/messages body (count_tokens: the same fields, max_tokens not required).
Expected<ParsedRequest> ParseRequest(std::string_view body, bool count_tokens, RequestError* error);

std::string ErrorBody(const RequestError& error);

// One per request, as openai::ResponseWriter: SSE events ("event: NAME\ndata: {...}\n\n") or the
// whole message. message_start goes out with the first event and carries that event's
// usage.prompt_tokens and cached_tokens as input_tokens (0 where the event has none: the
// message_delta at the end repeats input_tokens); a kFinished of kError ends a stream with an
// "error" event, and makes Body() the error JSON (the route picks the HTTP status). Not
// thread-safe.
class ResponseWriter {
 public:
  ResponseWriter(std::string id, std::string model);
  // Streaming: the SSE text for this event (may be empty; nothing after kFinished).
  std::string Events(const ChatEvent& event);
  // Non-streaming: accumulates events; after kFinished, Body() is the message JSON.
  void Add(const ChatEvent& event);
  std::string Body() const;

 private:
  struct Block {
    enum class Type { kText, kThinking, kToolUse } type = Type::kText;
    std::string text;  // text, thinking, or the tool input's JSON text
    ToolCall call;
  };
  std::string OpenBlock(Block block);
  std::string CloseBlock();
  std::string Delta(nlohmann::ordered_json delta) const;
  std::string InputJsonDelta(const std::string& partial_json);
  std::string BeginToolUse(int tool_index, const ToolCall& call);
  std::string ToolUseArgs(int tool_index, const std::string& piece);
  std::string EndToolUse(int tool_index, const ToolCall& call);
  bool IsOpenTool(int tool_index) const;
  std::string Finish(const ChatEvent& event);

  std::string id_, model_;
  bool started_ = false;
  bool finished_ = false;
  int open_block_ = -1;  // index of the content block being streamed, or -1
  std::vector<Block> blocks_;
  std::vector<std::pair<int, int>> tool_blocks_;  // (ChatEvent::tool_index, index in blocks_)
  FinishReason finish_ = FinishReason::kStop;
  std::string stop_sequence_;
  std::string error_;
  ChatUsage usage_;
};

}  // namespace moetier::server::anthropic
