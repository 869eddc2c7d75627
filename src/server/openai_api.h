// The OpenAI API's JSON, both ways: POST /v1/chat/completions and /v1/completions bodies into a
// ChatRequest (every field checked: a wrong type or range is a RequestError naming it; unknown
// fields are ignored; fields that would change the answer and are not supported (n > 1, a
// response_format other than text, suffix, best_of > 1) are refused; logit_bias is read into
// the sampling; a completion's
// prompt may be token ids, and `echo` begins its answer and log-probabilities with it), and
// ChatEvents into a response object or SSE chunks ("data: {...}\n\n", the first delta carrying
// the role, tool calls as delta.tool_calls fragments, each chunk with text the logprobs of its
// tokens when asked, a last chunk with usage when stream_options.include_usage, then
// "data: [DONE]\n\n"). Log-probabilities (chat's logprobs/top_logprobs, the completions'
// logprobs) are the model's, before temperature and penalties (engine/logprobs.h), with
// OpenAI's -9999 for an impossible token. Errors in OpenAI's shape:
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "server/chat_service.h"
#include "server/chat_types.h"

namespace moetier::server::openai {

enum class Endpoint { kChatCompletions, kCompletions };

struct ParsedRequest {
  ChatRequest request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses a request body (any bytes: malformed JSON, bad UTF-8, huge numbers are errors).
Expected<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body, RequestError* error);

// {"error": {...}} for an error response.
std::string ErrorBody(const RequestError& error);

// Builds the response of one request from its events: as a whole (non-streaming) or as SSE
// chunks (streaming). One per request; not thread-safe.
class ResponseWriter {
 public:
  // `logprobs`: the request asked for log-probabilities (ChatRequest::top_logprobs >= 0); its
  // kLogprobs events go into the chunk that carries their text, or into the whole answer.
  ResponseWriter(Endpoint endpoint, std::string id, std::string model, int64_t created,
                 bool include_usage, bool logprobs = false);
  // Streaming: the SSE text to send for this event (may be empty); after kFinished it ends with
  // "data: [DONE]\n\n".
  std::string Chunk(const ChatEvent& event);
  // Non-streaming: accumulates events; after kFinished, Body() is the response JSON.
  void Add(const ChatEvent& event);
  std::string Body();

 private:
  // The logprobs object of the pending tokens (chat's or the completions' shape), or null when
  // the request asked for none.
  nlohmann::ordered_json TakeLogprobs();

  Endpoint endpoint_;
  std::string id_, model_;
  int64_t created_;
  bool include_usage_;
  bool logprobs_ = false;
  std::vector<TokenLogprobEntry> logprobs_pending_;  // not yet in a chunk (or the whole answer)
  int64_t text_offset_ = 0;  // completions: the characters of the tokens given so far
  bool sent_role_ = false;
  std::string content_, reasoning_;
  std::vector<ToolCall> tool_calls_;
  FinishReason finish_ = FinishReason::kStop;
  ChatUsage usage_;
};

}  // namespace moetier::server::openai
