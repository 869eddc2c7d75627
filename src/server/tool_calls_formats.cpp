// The pieces tool_calls_formats.h declares, shared by the output parser's core
// (output_parser.cpp) and the per-format block parsers: text helpers, the event sink, the
// incremental JSON scanner, the arguments streamer and the JSON call object parser.
#include "server/tool_calls_formats.h"

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

namespace moetier::server {
namespace detail {

// ---- text helpers ----------------------------------------------------------------------------

bool IsJsonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

namespace {

// The number of continuation bytes a lead byte announces, and the range of the first one
// (which excludes overlongs, surrogates and code points past U+10FFFF); -1 for a byte that
// cannot start a character.
struct Utf8Lead {
  int continuation = -1;
  unsigned char min = 0x80, max = 0xBF;
};

Utf8Lead ClassifyLead(unsigned char c) {
  if (c < 0x80) return {0, 0x80, 0xBF};
  if (c >= 0xC2 && c <= 0xDF) return {1, 0x80, 0xBF};
  if (c == 0xE0) return {2, 0xA0, 0xBF};
  if (c == 0xED) return {2, 0x80, 0x9F};
  if (c >= 0xE1 && c <= 0xEF) return {2, 0x80, 0xBF};
  if (c == 0xF0) return {3, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {3, 0x80, 0xBF};
  if (c == 0xF4) return {3, 0x80, 0x8F};
  return {};
}

bool IsContinuation(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Utf8Lead lead = ClassifyLead(static_cast<unsigned char>(text[i]));
    if (lead.continuation < 0 || text.size() - i <= static_cast<size_t>(lead.continuation))
      return false;
    for (int k = 1; k <= lead.continuation; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      const unsigned char lo = k == 1 ? lead.min : 0x80, hi = k == 1 ? lead.max : 0xBF;
      if (c < lo || c > hi) return false;
    }
    i += 1 + lead.continuation;
  }
  return true;
}

size_t Utf8SafeEnd(std::string_view text, size_t end) {
  // A character is at most 4 bytes: only the last 3 bytes before `end` can be an unfinished one.
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<unsigned char>(text[end - back]);
    if (IsContinuation(c)) continue;
    const Utf8Lead lead = ClassifyLead(c);
    return lead.continuation >= static_cast<int>(back) ? end - back : end;
  }
  return end;
}

size_t PartialMarkerStart(std::string_view text, std::string_view marker) {
  const size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return text.size() - n;
  }
  return text.size();
}

// ---- EventSink -------------------------------------------------------------------------------

void EventSink::Text(ChatEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  const int index = kind == ChatEvent::Kind::kToolCallArgs ? begun_ - 1 : 0;
  if (!events_.empty() && events_.back().kind == kind && events_.back().tool_index == index) {
    events_.back().text.append(text);
    return;
  }
  ChatEvent e;
  e.kind = kind;
  e.text = std::string(text);
  e.tool_index = index;
  events_.push_back(std::move(e));
}

void EventSink::Content(std::string_view text) {
  Text(ChatEvent::Kind::kContent, text);
}
void EventSink::Reasoning(std::string_view text) {
  Text(ChatEvent::Kind::kReasoning, text);
}
void EventSink::CallArgs(std::string_view text) {
  Text(ChatEvent::Kind::kToolCallArgs, text);
}

std::string EventSink::NewId() {
  static constexpr std::string_view kAlphabet =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  static constexpr int kIdChars = 24;
  std::string id = "call_";
  for (int i = 0; i < kIdChars; ++i) id.push_back(kAlphabet[rng_() % kAlphabet.size()]);
  return id;
}

void EventSink::BeginCall(std::string name) {
  current_ = ToolCall{NewId(), std::move(name), ""};
  ChatEvent e;
  e.kind = ChatEvent::Kind::kToolCallBegin;
  e.tool_index = begun_++;
  e.tool_call = current_;
  events_.push_back(std::move(e));
}

void EventSink::EndCall(std::string arguments) {
  current_.arguments = std::move(arguments);
  ChatEvent e;
  e.kind = ChatEvent::Kind::kToolCallEnd;
  e.tool_index = begun_ - 1;
  e.tool_call = current_;
  events_.push_back(std::move(e));
  ++completed_;
}

void EventSink::WholeCall(std::string name, std::string arguments) {
  BeginCall(std::move(name));
  CallArgs(arguments);
  EndCall(std::move(arguments));
}

std::vector<ChatEvent> EventSink::Take() {
  return std::exchange(events_, {});
}

// ---- JsonScanner -----------------------------------------------------------------------------

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A number is a completion point only while short enough to check cheaply at every byte
// that it is finite (nlohmann::json refuses 1e999); longer ones are checked at their end.
constexpr size_t kMaxCheckedNumberBytes = 32;

bool IsFiniteNumber(const std::string& text) {
  return std::isfinite(std::strtod(text.c_str(), nullptr));
}

}  // namespace

JsonScanner::Step JsonScanner::Fail() {
  failed_ = true;
  consumed_ = false;
  return Step::kError;
}

JsonScanner::Step JsonScanner::Push(char c) {
  consumed_ = true;
  if (failed_) return Fail();
  if (done_) {
    consumed_ = false;
    return Step::kDone;
  }
  switch (token_) {
    case Token::kString:
    case Token::kKey:
      return StringByte(static_cast<unsigned char>(c));
    case Token::kNumber:
      return NumberByte(c);
    case Token::kLiteral:
      if (c != literal_[literal_pos_]) return Fail();
      if (++literal_pos_ < literal_.size()) return Step::kMore;
      token_ = Token::kNone;
      return ValueDone();
    case Token::kNone:
      break;
  }
  return Structural(c);
}

JsonScanner::Step JsonScanner::Structural(char c) {
  if (IsJsonSpace(c)) return Step::kMore;
  if (stack_.empty()) return StartValue(c);
  Ctx& top = stack_.back();
  switch (top) {
    case Ctx::kObjectKeyOrEnd:
      if (c == '}') {
        stack_.pop_back();
        return ValueDone();
      }
      [[fallthrough]];
    case Ctx::kObjectKey:
      if (c != '"') return Fail();
      token_ = Token::kKey;
      return Step::kMore;
    case Ctx::kObjectColon:
      if (c != ':') return Fail();
      top = Ctx::kObjectValue;
      return Step::kMore;
    case Ctx::kObjectValue:
    case Ctx::kArrayValue:
      return StartValue(c);
    case Ctx::kObjectCommaOrEnd:
      if (c == ',') {
        top = Ctx::kObjectKey;
        return Step::kMore;
      }
      if (c != '}') return Fail();
      stack_.pop_back();
      return ValueDone();
    case Ctx::kArrayValueOrEnd:
      if (c != ']') return StartValue(c);
      stack_.pop_back();
      return ValueDone();
    case Ctx::kArrayCommaOrEnd:
      if (c == ',') {
        top = Ctx::kArrayValue;
        return Step::kMore;
      }
      if (c != ']') return Fail();
      stack_.pop_back();
      return ValueDone();
  }
  return Fail();
}

JsonScanner::Step JsonScanner::StartValue(char c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxJsonDepth) return Fail();
      stack_.push_back(c == '{' ? Ctx::kObjectKeyOrEnd : Ctx::kArrayValueOrEnd);
      return Step::kMore;
    case '"':
      token_ = Token::kString;
      return Step::kMore;
    case 't':
    case 'f':
    case 'n':
      token_ = Token::kLiteral;
      literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      literal_pos_ = 1;
      return Step::kMore;
    default:
      break;
  }
  if (c != '-' && (c < '0' || c > '9')) return Fail();
  token_ = Token::kNumber;
  num_ = c == '-' ? Num::kMinus : c == '0' ? Num::kZero : Num::kInt;
  number_.assign(1, c);
  return Step::kMore;
}

JsonScanner::Step JsonScanner::ValueDone() {
  if (stack_.empty()) {
    done_ = true;
    return Step::kDone;
  }
  Ctx& top = stack_.back();
  if (top == Ctx::kObjectValue) top = Ctx::kObjectCommaOrEnd;
  if (top == Ctx::kArrayValue || top == Ctx::kArrayValueOrEnd) top = Ctx::kArrayCommaOrEnd;
  return Step::kMore;
}

JsonScanner::Step JsonScanner::StringByte(unsigned char c) {
  if (esc_ != Esc::kNone) return EscapeByte(static_cast<char>(c));
  if (utf8_left_ > 0) {
    if (c < utf8_min_ || c > utf8_max_) return Fail();
    --utf8_left_;
    utf8_min_ = 0x80;
    utf8_max_ = 0xBF;
    return Step::kMore;
  }
  if (c == '"') {
    const bool key = token_ == Token::kKey;
    token_ = Token::kNone;
    if (!key) return ValueDone();
    stack_.back() = Ctx::kObjectColon;
    return Step::kMore;
  }
  if (c == '\\') {
    esc_ = Esc::kBackslash;
    return Step::kMore;
  }
  if (c < 0x20) return Fail();
  const Utf8Lead lead = ClassifyLead(c);
  if (lead.continuation < 0) return Fail();
  utf8_left_ = lead.continuation;
  utf8_min_ = lead.min;
  utf8_max_ = lead.max;
  return Step::kMore;
}

JsonScanner::Step JsonScanner::EscapeByte(char c) {
  switch (esc_) {
    case Esc::kBackslash:
      if (c == 'u') {
        esc_ = Esc::kHex;
        hex_ = 0;
        hex_digits_ = 0;
        return Step::kMore;
      }
      if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return Fail();
      esc_ = Esc::kNone;
      return Step::kMore;
    case Esc::kLowBackslash:
      if (c != '\\') return Fail();
      esc_ = Esc::kLowU;
      return Step::kMore;
    case Esc::kLowU:
      if (c != 'u') return Fail();
      esc_ = Esc::kLowHex;
      hex_ = 0;
      hex_digits_ = 0;
      return Step::kMore;
    case Esc::kHex:
    case Esc::kLowHex: {
      const int v = HexValue(c);
      if (v < 0) return Fail();
      hex_ = hex_ * 16 + static_cast<uint32_t>(v);
      if (++hex_digits_ < 4) return Step::kMore;
      const bool low = hex_ >= 0xDC00 && hex_ <= 0xDFFF;
      const bool high = hex_ >= 0xD800 && hex_ <= 0xDBFF;
      if (esc_ == Esc::kLowHex) {
        if (!low) return Fail();
        esc_ = Esc::kNone;
        return Step::kMore;
      }
      if (low) return Fail();
      esc_ = high ? Esc::kLowBackslash : Esc::kNone;
      return Step::kMore;
    }
    case Esc::kNone:
      break;
  }
  return Fail();
}

JsonScanner::Step JsonScanner::NumberByte(char c) {
  const bool digit = c >= '0' && c <= '9';
  const bool exp = c == 'e' || c == 'E';
  bool more = true;
  switch (num_) {
    case Num::kMinus:
      if (!digit) return Fail();
      num_ = c == '0' ? Num::kZero : Num::kInt;
      break;
    case Num::kZero:
    case Num::kInt:
      if (digit && num_ == Num::kInt) break;
      if (c == '.')
        num_ = Num::kDot;
      else if (exp)
        num_ = Num::kE;
      else
        more = false;
      break;
    case Num::kDot:
      if (!digit) return Fail();
      num_ = Num::kFrac;
      break;
    case Num::kFrac:
      if (exp)
        num_ = Num::kE;
      else
        more = digit;
      break;
    case Num::kE:
      if (c == '+' || c == '-')
        num_ = Num::kESign;
      else if (digit)
        num_ = Num::kExp;
      else
        return Fail();
      break;
    case Num::kESign:
      if (!digit) return Fail();
      num_ = Num::kExp;
      break;
    case Num::kExp:
      more = digit;
      break;
  }
  if (more) {
    number_.push_back(c);
    return Step::kMore;
  }
  if (!IsFiniteNumber(number_)) return Fail();
  token_ = Token::kNone;
  if (ValueDone() == Step::kDone) {
    consumed_ = false;  // the byte after a top-level number is not part of it
    return Step::kDone;
  }
  return Structural(c);
}

bool JsonScanner::completable() const {
  if (done_) return true;
  if (failed_ || stack_.empty()) return false;
  switch (token_) {
    case Token::kString:
      return esc_ == Esc::kNone && utf8_left_ == 0;
    case Token::kKey:
    case Token::kLiteral:
      return false;
    case Token::kNumber:
      return (num_ == Num::kZero || num_ == Num::kInt || num_ == Num::kFrac || num_ == Num::kExp) &&
             number_.size() <= kMaxCheckedNumberBytes && IsFiniteNumber(number_);
    case Token::kNone:
      break;
  }
  const Ctx top = stack_.back();
  return top == Ctx::kObjectKeyOrEnd || top == Ctx::kObjectCommaOrEnd ||
         top == Ctx::kArrayValueOrEnd || top == Ctx::kArrayCommaOrEnd;
}

std::string JsonScanner::Closers() const {
  std::string closers = token_ == Token::kString ? "\"" : "";
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
    const bool array =
        *it == Ctx::kArrayValueOrEnd || *it == Ctx::kArrayValue || *it == Ctx::kArrayCommaOrEnd;
    closers.push_back(array ? ']' : '}');
  }
  return closers;
}

// ---- ArgsStreamer ----------------------------------------------------------------------------

size_t ArgsStreamer::Feed(std::string_view bytes) {
  size_t i = 0;
  for (; i < bytes.size() && !done() && !failed_; ++i) {
    if (scanner_.Push(bytes[i]) == JsonScanner::Step::kError) {
      failed_ = true;
      break;
    }
    text_.push_back(bytes[i]);
    if (scanner_.completable()) {
      safe_ = text_.size();
      safe_closers_ = scanner_.Closers();
    }
  }
  return i;
}

void ArgsStreamer::Flush(EventSink& sink) {
  if (safe_ <= flushed_) return;
  sink.CallArgs(std::string_view(text_).substr(flushed_, safe_ - flushed_));
  flushed_ = safe_;
}

std::string ArgsStreamer::Arguments() const {
  if (done()) return text_;
  return text_.substr(0, safe_) + safe_closers_;
}

// ---- JsonCallParser --------------------------------------------------------------------------

namespace {

size_t SkipSpace(std::string_view s, size_t p) {
  while (p < s.size() && IsJsonSpace(s[p])) ++p;
  return p;
}

enum class Match { kNeedMore, kMismatch, kMatch };

// A JSON string literal at `p`: its end (past the quote) and decoded value.
Match ParseStringLiteral(std::string_view s, size_t p, size_t* end, std::string* value) {
  if (p >= s.size()) return Match::kNeedMore;
  if (s[p] != '"') return Match::kMismatch;
  size_t q = p + 1;
  while (q < s.size() && s[q] != '"') q += s[q] == '\\' ? 2 : 1;
  if (q >= s.size()) return Match::kNeedMore;
  const auto parsed = nlohmann::json::parse(s.substr(p, q + 1 - p), nullptr, false);
  if (!parsed.is_string()) return Match::kMismatch;
  *value = parsed.get<std::string>();
  *end = q + 1;
  return Match::kMatch;
}

// `{"name": NAME, "arguments"|"parameters": {` at the start of `s`: the name and where the
// arguments' '{' is.
Match ParseCallHead(std::string_view s, std::string* name, size_t* args_pos) {
  size_t p = SkipSpace(s, 0);
  if (p >= s.size()) return Match::kNeedMore;
  if (s[p] != '{') return Match::kMismatch;
  // Keys and punctuation in order; each step needs more text or mismatches.
  std::string key;
  auto key_is = [&](std::initializer_list<std::string_view> wanted) -> Match {
    const Match m = ParseStringLiteral(s, SkipSpace(s, p), &p, &key);
    if (m != Match::kMatch) return m;
    for (std::string_view w : wanted)
      if (key == w) return Match::kMatch;
    return Match::kMismatch;
  };
  auto punct = [&](char c) -> Match {
    p = SkipSpace(s, p);
    if (p >= s.size()) return Match::kNeedMore;
    if (s[p] != c) return Match::kMismatch;
    ++p;
    return Match::kMatch;
  };
  ++p;
  Match m = key_is({"name"});
  if (m == Match::kMatch) m = punct(':');
  if (m == Match::kMatch) m = ParseStringLiteral(s, SkipSpace(s, p), &p, name);
  if (m == Match::kMatch && (name->empty() || name->size() > kMaxNameBytes)) m = Match::kMismatch;
  if (m == Match::kMatch) m = punct(',');
  if (m == Match::kMatch) m = key_is({"arguments", "parameters"});
  if (m == Match::kMatch) m = punct(':');
  if (m != Match::kMatch) return m;
  p = SkipSpace(s, p);
  if (p >= s.size()) return Match::kNeedMore;
  if (s[p] != '{') return Match::kMismatch;
  *args_pos = p;
  return Match::kMatch;
}

// The arguments of a call parsed whole: an object (re-serialized compactly), a string holding
// one (as written), or, where `optional`, absent ("{}").
bool WholeArguments(const nlohmann::ordered_json& call, bool optional, std::string* arguments) {
  const char* key = call.contains("arguments") ? "arguments" : "parameters";
  if (!call.contains(key)) {
    *arguments = "{}";
    return optional;
  }
  const auto& args = call[key];
  if (args.is_object()) {
    *arguments = args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return true;
  }
  if (!args.is_string()) return false;
  const std::string& text = args.get_ref<const std::string&>();
  if (!nlohmann::json::parse(text, nullptr, false).is_object()) return false;
  *arguments = text;
  return true;
}

}  // namespace

bool JsonCallParser::Feed(std::string_view bytes, EventSink& sink, std::string* leftover) {
  switch (state_) {
    case State::kHead:
      return FeedHead(bytes, sink, leftover);
    case State::kArgs:
      return FeedArgs(bytes, sink, leftover);
    case State::kTrailer:
      return FeedTrailer(bytes, sink, leftover);
    case State::kWhole:
      raw_.append(bytes);
      return FeedWhole(sink, leftover);
    case State::kEnded:
    case State::kNotACall:
      break;
  }
  if (end_ == End::kAtObjectClose) {
    leftover->assign(bytes);
    return true;
  }
  if (state_ == State::kNotACall) raw_.append(bytes);
  return false;
}

bool JsonCallParser::FeedHead(std::string_view bytes, EventSink& sink, std::string* leftover) {
  raw_.append(bytes);
  std::string name;
  size_t args_pos = 0;
  const Match m = ParseCallHead(raw_, &name, &args_pos);
  if (m == Match::kNeedMore && raw_.size() <= kMaxHeadBytes) return false;
  if (m != Match::kMatch) {
    state_ = State::kWhole;
    return FeedWhole(sink, leftover);
  }
  sink.BeginCall(std::move(name));
  state_ = State::kArgs;
  const std::string args = raw_.substr(args_pos);
  return FeedArgs(args, sink, leftover);
}

bool JsonCallParser::FeedArgs(std::string_view bytes, EventSink& sink, std::string* leftover) {
  const size_t n = args_.Feed(bytes);
  args_.Flush(sink);
  if (args_.failed()) {
    sink.EndCall(args_.Arguments());
    state_ = State::kEnded;
    if (end_ == End::kAtBodyEnd) return false;
    leftover->assign(bytes.substr(n));
    return true;
  }
  if (!args_.done()) return false;
  state_ = State::kTrailer;
  // The rest of the call object, scanned as if after a first member, to find its end.
  for (char c : std::string_view("{\"\":0")) whole_.Push(c);
  return FeedTrailer(bytes.substr(n), sink, leftover);
}

bool JsonCallParser::FeedTrailer(std::string_view bytes, EventSink& sink, std::string* leftover) {
  if (end_ == End::kAtBodyEnd) return false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const JsonScanner::Step step = whole_.Push(bytes[i]);
    if (step == JsonScanner::Step::kMore) continue;
    // The object closed (or turned invalid after complete arguments): the call is complete.
    sink.EndCall(args_.Arguments());
    state_ = State::kEnded;
    leftover->assign(bytes.substr(whole_.consumed() ? i + 1 : i));
    return true;
  }
  return false;
}

bool JsonCallParser::FeedWhole(EventSink& sink, std::string* leftover) {
  for (; whole_fed_ < raw_.size() && !whole_.done(); ++whole_fed_) {
    const JsonScanner::Step step = whole_.Push(raw_[whole_fed_]);
    if (step == JsonScanner::Step::kMore) continue;
    if (step == JsonScanner::Step::kError) {
      state_ = State::kNotACall;
    } else if (whole_.consumed()) {
      ++whole_fed_;
    }
    break;
  }
  if (end_ == End::kAtBodyEnd) return false;
  if (state_ != State::kNotACall && !whole_.done()) return false;
  leftover->assign(raw_.substr(whole_fed_));
  raw_.resize(whole_fed_);
  if (state_ != State::kNotACall) state_ = EmitWhole(sink) ? State::kEnded : State::kNotACall;
  return true;
}

bool JsonCallParser::EmitWhole(EventSink& sink) {
  const auto call = nlohmann::ordered_json::parse(raw_.substr(0, whole_fed_), nullptr, false);
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return false;
  std::string name = call["name"].get<std::string>();
  std::string arguments;
  // Inside Hermes tags a call needs no arguments; a bare JSON answer (Llama 3) is a call only
  // with them, or any {"name": ...} object the user asked for would be taken for one.
  const bool optional = end_ == End::kAtBodyEnd;
  if (name.empty() || name.size() > kMaxNameBytes || !WholeArguments(call, optional, &arguments))
    return false;
  sink.WholeCall(std::move(name), std::move(arguments));
  return true;
}

bool JsonCallParser::Close(EventSink& sink) {
  switch (state_) {
    case State::kHead:
      state_ = State::kNotACall;
      return false;
    case State::kArgs:
    case State::kTrailer:
      args_.Flush(sink);
      sink.EndCall(args_.Arguments());
      state_ = State::kEnded;
      return true;
    case State::kWhole:
      state_ = whole_.done() && EmitWhole(sink) ? State::kEnded : State::kNotACall;
      return state_ == State::kEnded;
    case State::kEnded:
      return true;
    case State::kNotACall:
      return false;
  }
  return false;
}

}  // namespace detail

}  // namespace moetier::server
