// DeepSeek-V3 tool calls, as its chat template renders them:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
//   <｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
// (｜ is U+FF5C, ▁ is U+2581). The block opens at <｜tool▁calls▁begin｜> (found by the core)
// and holds calls separated by whitespace until <｜tool▁calls▁end｜>. The code fence around the
// arguments is optional; text between the arguments and <｜tool▁call▁end｜> is ignored.
#include "server/tool_calls_formats.h"

namespace moetier::server::detail {
namespace {

constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";

enum class Head { kNeedMore, kMismatch, kMatch };

bool IsNameByte(unsigned char c) {
  return c >= 0x20 && c != 0x7F && c != '<';
}

// `TYPE<｜tool▁sep｜>NAME\n` then an optional ```json fence and the arguments' '{'.
Head ParseHead(std::string_view s, std::string* name, size_t* args_pos) {
  const size_t sep = s.find(kSep);
  if (sep == s.npos)
    return s.size() > kMaxNameBytes + kSep.size() ? Head::kMismatch : Head::kNeedMore;
  const size_t name_begin = sep + kSep.size();
  const size_t newline = s.find('\n', name_begin);
  if (newline == s.npos)
    return s.size() - name_begin > kMaxNameBytes ? Head::kMismatch : Head::kNeedMore;
  std::string_view n = s.substr(name_begin, newline - name_begin);
  while (!n.empty() && (n.back() == ' ' || n.back() == '\r')) n.remove_suffix(1);
  while (!n.empty() && n.front() == ' ') n.remove_prefix(1);
  if (n.empty() || n.size() > kMaxNameBytes || !IsValidUtf8(n)) return Head::kMismatch;
  for (char c : n)
    if (!IsNameByte(static_cast<unsigned char>(c))) return Head::kMismatch;
  size_t p = newline + 1;
  while (p < s.size() && IsJsonSpace(s[p])) ++p;
  for (std::string_view fence : {std::string_view("```json"), std::string_view("```")}) {
    const std::string_view rest = s.substr(p);
    if (rest.size() < fence.size() && fence.starts_with(rest)) return Head::kNeedMore;
    if (rest.starts_with(fence)) {
      p += fence.size();
      break;
    }
  }
  while (p < s.size() && IsJsonSpace(s[p])) ++p;
  if (p >= s.size()) return Head::kNeedMore;
  if (s[p] != '{') return Head::kMismatch;
  *name = std::string(n);
  *args_pos = p;
  return Head::kMatch;
}

// One call's body, between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>.
class DeepSeekCall {
 public:
  void Feed(std::string_view bytes, EventSink& sink) {
    switch (state_) {
      case State::kHead:
        FeedHead(bytes, sink);
        return;
      case State::kArgs:
        FeedArgs(bytes, sink);
        return;
      case State::kNotACall:
        raw_.append(bytes);
        return;
      case State::kTrailer:
      case State::kEnded:
        return;
    }
  }

  // The body is over: by its end marker (`closed`) or by the end of generation.
  void Close(bool closed, EventSink& sink) {
    switch (state_) {
      case State::kHead:
      case State::kNotACall:
        sink.Content(std::string(kCallBegin) + raw_ + (closed ? std::string(kCallEnd) : ""));
        break;
      case State::kArgs:
      case State::kTrailer:
        args_.Flush(sink);
        sink.EndCall(args_.Arguments());
        break;
      case State::kEnded:
        break;
    }
    state_ = State::kEnded;
  }

 private:
  enum class State { kHead, kArgs, kTrailer, kEnded, kNotACall };

  void FeedHead(std::string_view bytes, EventSink& sink) {
    raw_.append(bytes);
    std::string name;
    size_t args_pos = 0;
    const Head h = ParseHead(raw_, &name, &args_pos);
    if (h == Head::kNeedMore && raw_.size() <= kMaxHeadBytes) return;
    if (h != Head::kMatch) {
      state_ = State::kNotACall;
      return;
    }
    sink.BeginCall(std::move(name));
    state_ = State::kArgs;
    FeedArgs(std::string_view(raw_).substr(args_pos), sink);
  }

  void FeedArgs(std::string_view bytes, EventSink& sink) {
    args_.Feed(bytes);
    args_.Flush(sink);
    if (args_.failed()) {
      sink.EndCall(args_.Arguments());
      state_ = State::kEnded;
    } else if (args_.done()) {
      state_ = State::kTrailer;
    }
  }

  State state_ = State::kHead;
  std::string raw_;  // the body so far, while it may still be no call
  ArgsStreamer args_;
};

class DeepSeekBlock final : public ToolCallBlock {
 public:
  bool Feed(std::string_view text, EventSink& sink, std::string* after) override {
    pending_.append(text);
    while (true) {
      if (call_ != nullptr) {
        const size_t end = pending_.find(kCallEnd);
        if (end == std::string::npos) {
          const size_t keep = PartialMarkerStart(pending_, kCallEnd);
          call_->Feed(std::string_view(pending_).substr(0, keep), sink);
          pending_.erase(0, keep);
          return false;
        }
        call_->Feed(std::string_view(pending_).substr(0, end), sink);
        call_->Close(/*closed=*/true, sink);
        call_.reset();
        pending_.erase(0, end + kCallEnd.size());
      }
      // Between calls: whitespace, then the next call or the block's end.
      const size_t p = pending_.find_first_not_of(" \t\r\n");
      if (p == std::string::npos) return false;
      const std::string_view rest = std::string_view(pending_).substr(p);
      if (rest.starts_with(kCallBegin)) {
        pending_.erase(0, p + kCallBegin.size());
        call_ = std::make_unique<DeepSeekCall>();
        continue;
      }
      if (rest.starts_with(kCallsEnd)) {
        after->assign(rest.substr(kCallsEnd.size()));
        return true;
      }
      if (kCallBegin.starts_with(rest) || kCallsEnd.starts_with(rest)) return false;
      after->assign(rest);  // text that is no markup: the block is over
      return true;
    }
  }

  void Finish(EventSink& sink) override {
    if (call_ != nullptr) {
      call_->Feed(pending_, sink);
      call_->Close(/*closed=*/false, sink);
      return;
    }
    const size_t p = pending_.find_first_not_of(" \t\r\n");
    if (p != std::string::npos) sink.Content(std::string_view(pending_).substr(p));
  }

 private:
  std::string pending_;  // text held back: a possible marker, or whitespace between calls
  std::unique_ptr<DeepSeekCall> call_;
};

}  // namespace

std::unique_ptr<ToolCallBlock> MakeDeepSeekBlock() {
  return std::make_unique<DeepSeekBlock>();
}

}  // namespace moetier::server::detail
