// What the API front ends (OpenAI, Anthropic) turn a request into, and what comes back: one
// conversation with its tools and sampling settings, and the events of its answer. The HTTP
// routes parse JSON into these and encode these into JSON; ChatService (chat_service.h) runs
// them on the engine. JSON appears here only where the API passes it through opaquely (a
// tool's parameter schema, a tool call's arguments, template variables).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moetier::server {

// A call the assistant made, in history (requests) or in an answer.
struct ToolCall {
  std::string id;         // e.g. "call_0a1b..."; the API's id, echoed back in tool results
  std::string name;       // the function's name
  std::string arguments;  // the arguments as JSON text (an object), as the API carries them
};

struct ChatMessage {
  enum class Role { kSystem, kUser, kAssistant, kTool };
  Role role = Role::kUser;
  std::string content;               // text (parts of a multi-part text content joined)
  std::string reasoning_content;     // assistant: what it thought (<think>), when given back
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool: which call this answers
  std::string name;                  // tool: the function's name, when given
};

struct ToolDefinition {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON Schema
};

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct SamplingParams {
  std::optional<int64_t> max_tokens;  // absent: until the context's end
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;  // absent: a fresh seed per request
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) pairs, added to the logits first.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct ChatRequest {
  // Either a conversation rendered by the model's chat template (chat completions, messages)...
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;
  // Variables for the template (chat_template_kwargs, e.g. {"enable_thinking": false}); an
  // object or null.
  nlohmann::ordered_json template_kwargs;
  // ...or a raw prompt (completions): used as is when `raw_prompt` is set.
  bool raw_prompt = false;
  std::string prompt;
  std::vector<int32_t> prompt_ids;  // a raw prompt given as token ids (then `prompt` is empty)
  // Completions: the answer begins with the prompt, and with top_logprobs >= 0 so do its
  // log-probabilities (the first token's null: nothing comes before it).
  bool echo = false;

  SamplingParams sampling;
  // -1: no log-probabilities; else each generated token's and this many alternatives' (chat's
  // top_logprobs, the completions' logprobs), at most kMaxTopLogprobs (engine/logprobs.h).
  int top_logprobs = -1;
  std::string model;  // as the client named it (echoed back)
};

// A token's text and its log-probability. `token` holds the token's bytes as the tokenizer
// decodes it alone: part of a UTF-8 character when the token ends inside one. NaN: none (an
// echoed prompt's first token).
struct TokenText {
  std::string token;
  float logprob = 0.0f;
};

// One generated token's log-probability and its most likely alternatives, most likely first.
struct TokenLogprobEntry {
  TokenText chosen;
  std::vector<TokenText> top;
};

enum class FinishReason { kStop, kLength, kToolCalls, kCancelled, kError };

struct ChatUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
  int64_t completion_tokens = 0;
};

// The answer as it is produced, in order. Text arrives in pieces; a stop string's possible
// beginning is held back until it is known not to be one.
struct ChatEvent {
  enum class Kind {
    kContent,        // text: a piece of the answer
    kReasoning,      // text: a piece of the reasoning (<think> ... </think>)
    kToolCallBegin,  // tool_index, tool_call.id, tool_call.name
    kToolCallArgs,   // tool_index, text: a piece of its arguments' JSON text
    kToolCallEnd,    // tool_index, tool_call: complete (arguments whole)
    kLogprobs,       // logprobs: one generated token's, before the text it completes
    kFinished,       // finish_reason, usage, error (for kError)
  };
  Kind kind = Kind::kContent;
  std::string text;
  int tool_index = 0;
  ToolCall tool_call;
  TokenLogprobEntry logprobs;  // kLogprobs
  FinishReason finish_reason = FinishReason::kStop;
  std::string stop_sequence;  // kFinished, kStop: the stop string that ended it (else empty)
  ChatUsage usage;            // kFinished: all of it; before: prompt_tokens only
  double ttft_ms = 0;
  std::string error;
};

}  // namespace moetier::server
