// Fuzz target: the output parser (server/output_parser.h) over arbitrary generated text, fed
// whole and in random pieces. Input: byte 0 picks the options (format, tools, starting inside
// reasoning), byte 1 seeds the cutting, the rest is the text. Aborts when:
// - the pieces give another answer than the whole text (text of a kind merged);
// - a call is malformed as events (Args or End outside their call, arguments that are not a
//   JSON object nlohmann::json parses, or that do not begin with the streamed fragments);
// - content and reasoning are not drawn, in order, from the input (text invented);
// - with no call made, content and reasoning do not account for the input: equal to it once
//   whitespace and the markup the parser consumes (<think>, </think>, DeepSeek's block
//   markers) are taken out of both (Strip);
// - for valid UTF-8 input, an event's text cuts a character.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/output_parser.h"

namespace {

using moetier::server::ChatEvent;
using moetier::server::MakeOutputParser;
using moetier::server::OutputParserOptions;
using moetier::server::ToolCallFormat;
using Kind = ChatEvent::Kind;

void Check(bool ok) {
  if (!ok) std::abort();
}

struct Answer {
  std::vector<ChatEvent> events;
  int tool_calls = 0;
};

Answer Run(const OutputParserOptions& options, const std::vector<std::string_view>& pieces) {
  auto parser = MakeOutputParser(options, /*seed=*/1);
  Answer a;
  for (std::string_view piece : pieces) {
    for (ChatEvent& e : parser->Feed(piece)) a.events.push_back(std::move(e));
  }
  for (ChatEvent& e : parser->Finish()) a.events.push_back(std::move(e));
  a.tool_calls = parser->tool_calls();
  return a;
}

// The events in order, adjacent text of a kind joined: what the stream said, however it was cut.
std::string Trace(const Answer& a) {
  std::string trace;
  char last = 0;
  for (const ChatEvent& e : a.events) {
    char tag = 0;
    switch (e.kind) {
      case Kind::kContent:
        tag = 'C';
        break;
      case Kind::kReasoning:
        tag = 'R';
        break;
      case Kind::kToolCallArgs:
        tag = 'A';
        break;
      case Kind::kToolCallBegin:
        trace +=
            "\x01"
            "B" +
            e.tool_call.name + "\x01";
        break;
      case Kind::kToolCallEnd:
        trace +=
            "\x01"
            "E" +
            e.tool_call.arguments + "\x01";
        break;
      case Kind::kLogprobs:  // the parser gives only text and calls
      case Kind::kFinished:
        std::abort();
    }
    if (tag != 0 && tag != last) trace += std::string("\x02") + tag;
    if (tag != 0) trace += e.text;
    last = tag;
  }
  return trace;
}

bool IsValidUtf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

void CheckCalls(const Answer& a) {
  int begun = 0, ended = 0;
  std::string fragments;
  for (const ChatEvent& e : a.events) {
    if (e.kind == Kind::kToolCallBegin) {
      Check(begun == ended && e.tool_index == begun && !e.tool_call.name.empty());
      ++begun;
      fragments.clear();
    } else if (e.kind == Kind::kToolCallArgs) {
      Check(begun == ended + 1 && e.tool_index == ended);
      fragments += e.text;
    } else if (e.kind == Kind::kToolCallEnd) {
      Check(begun == ended + 1 && e.tool_index == ended);
      Check(e.tool_call.arguments.starts_with(fragments));
      Check(nlohmann::json::parse(e.tool_call.arguments, nullptr, false).is_object());
      ++ended;
    }
  }
  Check(begun == ended && a.tool_calls == ended);
}

bool IsSubsequence(std::string_view part, std::string_view whole) {
  size_t at = 0;
  for (char c : part) {
    at = whole.find(c, at);
    if (at == whole.npos) return false;
    ++at;
  }
  return true;
}

// `s` without whitespace, then without the markup the parser consumes even when it makes no
// call, removed until none is left: text between removed markup may join into markup again
// ("</thin" "</think>" "k>"), on both sides alike. No marker overlaps another, so the order
// of removal does not change the result.
std::string Strip(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') out.push_back(c);
  for (bool removed = true; removed;) {
    removed = false;
    for (std::string_view m :
         {std::string_view("</think>"), std::string_view("<think>"),
          std::string_view("<｜tool▁calls▁begin｜>"), std::string_view("<｜tool▁calls▁end｜>")}) {
      for (size_t at; (at = out.find(m)) != std::string::npos; removed = true)
        out.erase(at, m.size());
    }
  }
  return out;
}

void CheckText(const Answer& a, std::string_view text) {
  std::string said;
  const bool valid_input = IsValidUtf8(std::string(text));
  for (const ChatEvent& e : a.events) {
    if (e.kind == Kind::kContent || e.kind == Kind::kReasoning) said += e.text;
    if (valid_input) Check(IsValidUtf8(e.text));
  }
  Check(IsSubsequence(said, text));
  if (a.tool_calls == 0) Check(Strip(said) == Strip(text));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  OutputParserOptions options;
  options.format = static_cast<ToolCallFormat>(data[0] & 3);
  options.tools_enabled = (data[0] & 4) != 0;
  options.starts_in_reasoning = (data[0] & 8) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);

  std::vector<std::string_view> pieces;
  uint32_t state = data[1] * 2654435761u + 1;
  for (size_t at = 0; at < text.size();) {
    state = state * 1664525u + 1013904223u;
    const size_t n = 1 + (state >> 24) % 16;
    pieces.push_back(text.substr(at, n));
    at += n;
  }
  const Answer whole = Run(options, {text});
  const Answer cut = Run(options, pieces);
  Check(Trace(whole) == Trace(cut));
  CheckCalls(cut);
  CheckText(cut, text);
  return 0;
}
