// The pieces the output parser (output_parser.h) is built from, private to it: the event sink
// that numbers calls and draws their ids, a strict incremental JSON scanner, the streamer of a
// call's arguments, the JSON call object shared by Hermes and Llama 3, and one block parser
// per tool-call format (tool_calls_hermes.cpp, tool_calls_llama3.cpp, tool_calls_deepseek.cpp).
//
// A "block" is a format's tool-call markup from just after the marker that opened it (the core
// in output_parser.cpp finds that marker in the content and holds back a partial one). The
// block consumes text until its markup ends and hands back what follows, which is content
// again.
//
// Commitment: a call is announced (kToolCallBegin) once its name is known and its arguments
// have begun as a JSON object; from then on it cannot be taken back. Markup that turns out
// not to be a call before that point goes out as content, byte for byte (but for DeepSeek's
// <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜> around it). A call that breaks
// after it was announced (invalid JSON in its arguments, or generation ending inside them) is
// closed at the last point where its arguments were a valid JSON prefix, with the brackets
// and quote that were open; the rest of its markup, up to its closing tag, is dropped (Llama
// 3 calls have no closing tag: there the text from the invalid byte on is content).
//
// Arguments are passed on as the model wrote them (the JSON text of the value, byte for
// byte: the streamed fragments add up to kToolCallEnd's arguments), except for calls parsed
// whole (see JsonCallParser), whose arguments are re-serialized compactly.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "server/chat_types.h"

namespace moetier::server::detail {

// A tool name longer than this is not a name (a model rambling inside the markup): the
// markup is then treated as text. Real function names are a few dozen bytes.
inline constexpr size_t kMaxNameBytes = 256;
// The part of a call before its arguments ({"name": "...", "arguments": ) longer than this
// (whitespace, odd key order) is parsed only once the call is complete, not streamed.
inline constexpr size_t kMaxHeadBytes = 1024;
// Nesting deeper than this in a call's JSON makes it malformed; it bounds the scanner's stack.
inline constexpr size_t kMaxJsonDepth = 128;

bool IsJsonSpace(char c);
// Whether `text` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool IsValidUtf8(std::string_view text);
// The largest end <= `end` that does not cut a multi-byte UTF-8 sequence in `text` (an
// invalid sequence is not held: only a lead byte still waiting for its continuation bytes).
size_t Utf8SafeEnd(std::string_view text, size_t end);
// Where the longest suffix of `text` that is a proper prefix of `marker` begins (text.size()
// when there is none): the bytes to hold back until the marker is decided.
size_t PartialMarkerStart(std::string_view text, std::string_view marker);

// Collects the parser's events: text pieces (adjacent ones of a kind merged), calls numbered
// in order with ids drawn from the request's seed.
class EventSink {
 public:
  explicit EventSink(uint64_t seed) : rng_(seed) {}
  void Content(std::string_view text);
  void Reasoning(std::string_view text);
  void BeginCall(std::string name);
  void CallArgs(std::string_view text);
  // Completes the call begun last with its whole arguments.
  void EndCall(std::string arguments);
  // A call begun and ended at once (markup parsed only when complete).
  void WholeCall(std::string name, std::string arguments);
  int completed_calls() const { return completed_; }
  int begun_calls() const { return begun_; }
  std::vector<ChatEvent> Take();

 private:
  void Text(ChatEvent::Kind kind, std::string_view text);
  std::string NewId();

  std::mt19937_64 rng_;
  std::vector<ChatEvent> events_;
  ToolCall current_;
  int begun_ = 0;
  int completed_ = 0;
};

// A strict incremental JSON validator (RFC 8259, as nlohmann::json parses it: UTF-8 checked,
// surrogate pairs matched), one byte at a time, with no recursion. It knows at each byte
// whether the text so far can be completed by closing what is open (a quote, brackets).
class JsonScanner {
 public:
  enum class Step { kMore, kDone, kError };
  // Feeds one byte. kDone: this byte completed the top-level value (a number completes only
  // at the byte after it, which is then not consumed: kDone is returned with consumed()
  // false). kError: the byte cannot continue valid JSON (not consumed); later calls error too.
  Step Push(char c);
  bool consumed() const { return consumed_; }
  bool done() const { return done_; }
  // Whether the text so far plus Closers() is valid JSON.
  bool completable() const;
  std::string Closers() const;

 private:
  enum class Ctx : uint8_t {
    kObjectKeyOrEnd,
    kObjectKey,
    kObjectColon,
    kObjectValue,
    kObjectCommaOrEnd,
    kArrayValueOrEnd,
    kArrayValue,
    kArrayCommaOrEnd,
  };
  enum class Token : uint8_t { kNone, kString, kKey, kNumber, kLiteral };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
  enum class Esc : uint8_t { kNone, kBackslash, kHex, kLowBackslash, kLowU, kLowHex };

  Step Structural(char c);
  Step StartValue(char c);
  Step ValueDone();
  Step StringByte(unsigned char c);
  Step EscapeByte(char c);
  Step NumberByte(char c);
  Step Fail();

  std::vector<Ctx> stack_;
  Token token_ = Token::kNone;
  Num num_ = Num::kZero;
  Esc esc_ = Esc::kNone;
  std::string number_;        // the number being read (checked finite at its end)
  std::string_view literal_;  // "true", "false" or "null" while one is read
  size_t literal_pos_ = 0;
  uint32_t hex_ = 0;  // the \u escape's value so far
  int hex_digits_ = 0;
  int utf8_left_ = 0;                                // continuation bytes still expected
  unsigned char utf8_min_ = 0x80, utf8_max_ = 0xBF;  // the next continuation byte's range
  bool done_ = false;
  bool failed_ = false;
  bool consumed_ = false;
};

// Streams one call's arguments (a JSON object, from its '{'): fragments up to the last point
// where the text is a valid JSON prefix that closing brackets complete, so a fragment never
// ends inside a key, an escape or a UTF-8 character.
class ArgsStreamer {
 public:
  // Consumes bytes until the object completes or turns invalid; returns how many it took.
  size_t Feed(std::string_view bytes);
  // Sends the fragment that became safe since the last flush.
  void Flush(EventSink& sink);
  bool done() const { return scanner_.done(); }
  bool failed() const { return failed_; }
  // The whole arguments when done, else the flushed text closed (valid JSON either way).
  std::string Arguments() const;

 private:
  JsonScanner scanner_;
  std::string text_;
  size_t safe_ = 0;  // text_[0, safe_) + safe_closers_ is valid JSON
  std::string safe_closers_ = "}";
  size_t flushed_ = 0;
  bool failed_ = false;
};

// A call written as a JSON object: {"name": NAME, "arguments" | "parameters": {...}}.
// Streamed when "name" comes first and the arguments are an object; in any other layout
// (arguments first, arguments as a JSON string, extra keys first) it is parsed when the
// object is complete and its arguments re-serialized compactly.
class JsonCallParser {
 public:
  enum class End {
    kAtBodyEnd,      // Hermes: the call lasts until its closing tag, text after the object ignored
    kAtObjectClose,  // Llama 3: the call ends with its object
  };
  explicit JsonCallParser(End end) : end_(end) {}
  // Consumes the call's bytes. Returns true when the call has ended (kAtObjectClose only);
  // `leftover` then gets the bytes that follow it, and not_a_call() says whether raw() must
  // go out as content instead.
  bool Feed(std::string_view bytes, EventSink& sink, std::string* leftover);
  bool not_a_call() const { return state_ == State::kNotACall; }
  // The body is over (its closing tag, or the end of generation): completes the call.
  // Returns false when the bytes were not a call (raw() then goes out as content).
  bool Close(EventSink& sink);
  const std::string& raw() const { return raw_; }

 private:
  enum class State { kHead, kArgs, kTrailer, kWhole, kEnded, kNotACall };
  bool FeedHead(std::string_view bytes, EventSink& sink, std::string* leftover);
  bool FeedArgs(std::string_view bytes, EventSink& sink, std::string* leftover);
  bool FeedTrailer(std::string_view bytes, EventSink& sink, std::string* leftover);
  bool FeedWhole(EventSink& sink, std::string* leftover);
  bool EmitWhole(EventSink& sink);

  End end_;
  State state_ = State::kHead;
  std::string raw_;       // every byte consumed (the call's text, for content when it is none)
  size_t whole_fed_ = 0;  // bytes of raw_ fed to whole_ (up to the object's end)
  JsonScanner whole_;     // the object as a whole (kWhole), or its tail after the arguments
  ArgsStreamer args_;
};

// A format's tool-call markup after its opening marker.
class ToolCallBlock {
 public:
  virtual ~ToolCallBlock() = default;
  // Consumes text. Returns true when the markup has ended; `after` then gets the text that
  // follows it (content again).
  virtual bool Feed(std::string_view text, EventSink& sink, std::string* after) = 0;
  // Generation ended inside the block: completes or abandons what is open.
  virtual void Finish(EventSink& sink) = 0;
};

// The markers that open a block in content, per format.
inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kLlama3PythonTag = "<|python_tag|>";
inline constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>";

// `lead`: the text that opened the block (the whitespace before the marker and the marker),
// given back as content before a first call that turns out to be none.
std::unique_ptr<ToolCallBlock> MakeHermesBlock(std::string_view lead);
// Opened at the answer's start by '{' (the block's first text) or <|python_tag|> (in `lead`).
std::unique_ptr<ToolCallBlock> MakeLlama3Block(std::string_view lead);
std::unique_ptr<ToolCallBlock> MakeDeepSeekBlock();

}  // namespace moetier::server::detail
