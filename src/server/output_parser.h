// The model's generated text, split as it streams into what the APIs carry apart: reasoning
// (<think> ... </think>), plain content, and tool calls in the model's own format (chosen from
// its chat template: Qwen3 / Hermes <tool_call>{json}</tool_call>, Llama 3's bare JSON
// {"name": ..., "parameters": ...}, DeepSeek-V3's <｜tool▁calls▁begin｜> ... blocks). One parser
// per request; Feed and Finish return the events to send, in order. Markup that might still
// become a tag or a call is held back until it is known (so a stream never shows half a tag).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/chat_types.h"

namespace moetier::server {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kDeepSeekV3 };

// The format a chat template's tool calls take, from the template's source text (the markers
// it renders); kNone when it renders no tool calls.
ToolCallFormat DetectToolCallFormat(std::string_view template_source);
std::string_view ToolCallFormatName(ToolCallFormat f);

struct OutputParserOptions {
  ToolCallFormat format = ToolCallFormat::kNone;
  bool tools_enabled = false;        // the request offered tools (and tool_choice is not none)
  bool starts_in_reasoning = false;  // the rendered prompt ends inside an open <think>
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // The events that `piece` (the next generated text) completes: kContent, kReasoning and the
  // kToolCall* kinds (never kFinished).
  virtual std::vector<ChatEvent> Feed(std::string_view piece) = 0;
  // At the end of generation: whatever was held back, as content (an unfinished call's text is
  // content too), then nothing more.
  virtual std::vector<ChatEvent> Finish() = 0;
  // How many tool calls were completed (a finish reason of tool_calls when > 0).
  virtual int tool_calls() const = 0;
};

// Tool call ids are "call_" + 24 random alphanumerics from `seed` (a fresh one per request).
std::unique_ptr<OutputParser> MakeOutputParser(const OutputParserOptions& options, uint64_t seed);

}  // namespace moetier::server
