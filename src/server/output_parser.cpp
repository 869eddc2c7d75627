// The output parser's core: reasoning and content, and the markers that open a tool-call block
// (the block parsers and the pieces they share: tool_calls_formats.h).
//
// Whitespace decisions (markup, not text):
// - Line breaks right after <think>, right before </think> and right after </think> are
//   dropped: Qwen3 writes "<think>\n...\n</think>\n\n", and its template strips the same line
//   breaks when it renders reasoning back into the history.
// - Whitespace right before a marker that opens reasoning or a tool-call block is dropped (the
//   templates put "\n" between content and <tool_call>), and so is whitespace after calls.
//   Markup that turns out to be no call goes out as content with that whitespace, unchanged.
// - <think> opens reasoning only at the answer's start (nothing but whitespace before it);
//   later it is text. A </think> outside reasoning is text.
#include "server/output_parser.h"

#include "server/tool_calls_formats.h"

namespace moetier::server {

// ---- format detection ------------------------------------------------------------------------

ToolCallFormat DetectToolCallFormat(std::string_view source) {
  auto has = [&](std::string_view marker) { return source.find(marker) != source.npos; };
  if (has("tool▁calls▁begin")) return ToolCallFormat::kDeepSeekV3;
  if (has(detail::kHermesOpen)) return ToolCallFormat::kHermes;
  // Llama 3.1+ renders calls as {"name": ..., "parameters": ...} and their results in the
  // ipython role; <|python_tag|> marks its built-in tools.
  if (has(detail::kLlama3PythonTag) || (has("\"parameters\"") && has("ipython")))
    return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

std::string_view ToolCallFormatName(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
  }
  return "unknown";
}

// ---- the parser ------------------------------------------------------------------------------

namespace {

using detail::EventSink;
using detail::PartialMarkerStart;
using detail::ToolCallBlock;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool IsLineBreak(char c) {
  return c == '\n' || c == '\r';
}

// Where the run of characters that `pred` accepts, ending at `end`, begins.
template <typename Pred>
size_t RunStart(std::string_view text, size_t end, Pred pred) {
  while (end > 0 && pred(text[end - 1])) --end;
  return end;
}

class Parser final : public OutputParser {
 public:
  Parser(const OutputParserOptions& options, uint64_t seed) : options_(options), sink_(seed) {
    if (options.tools_enabled) {
      if (options.format == ToolCallFormat::kHermes) block_opener_ = detail::kHermesOpen;
      if (options.format == ToolCallFormat::kDeepSeekV3)
        block_opener_ = detail::kDeepSeekCallsBegin;
      llama3_start_ = options.format == ToolCallFormat::kLlama3Json;
    }
    if (options.starts_in_reasoning) EnterReasoning();
  }

  std::vector<ChatEvent> Feed(std::string_view piece) override {
    if (mode_ == Mode::kFinished) return {};
    pending_.append(piece);
    Pump();
    return sink_.Take();
  }

  std::vector<ChatEvent> Finish() override {
    if (mode_ == Mode::kFinished) return {};
    switch (mode_) {
      case Mode::kContent:
        if (DropLeading()) sink_.Content(pending_);
        break;
      case Mode::kReasoning:
        if (DropLeading())
          sink_.Reasoning(std::string_view(pending_).substr(
              0, RunStart(pending_, pending_.size(), IsLineBreak)));
        break;
      case Mode::kBlock:
        block_->Finish(sink_);
        break;
      case Mode::kFinished:
        break;
    }
    pending_.clear();
    mode_ = Mode::kFinished;
    return sink_.Take();
  }

  int tool_calls() const override { return sink_.completed_calls(); }

 private:
  enum class Mode { kContent, kReasoning, kBlock, kFinished };
  // What is dropped from the start of the text that comes next (see the file's comment).
  enum class Drop { kNothing, kLineBreaks, kWhitespace };

  void Pump() {
    for (bool more = true; more;) {
      switch (mode_) {
        case Mode::kContent:
          more = PumpContent();
          break;
        case Mode::kReasoning:
          more = PumpReasoning();
          break;
        case Mode::kBlock:
          more = PumpBlock();
          break;
        case Mode::kFinished:
          more = false;
          break;
      }
    }
  }

  void EnterReasoning() {
    mode_ = Mode::kReasoning;
    drop_ = Drop::kLineBreaks;
    think_allowed_ = false;
  }

  void OpenBlock(std::unique_ptr<ToolCallBlock> block) {
    block_ = std::move(block);
    calls_before_block_ = sink_.begun_calls();
    mode_ = Mode::kBlock;
    think_allowed_ = false;
    llama3_start_ = false;
  }

  // Applies drop_ to the start of pending_; false when nothing is left to look at yet.
  bool DropLeading() {
    if (drop_ == Drop::kNothing) return true;
    const auto skip = [&](char c) {
      return drop_ == Drop::kWhitespace ? detail::IsJsonSpace(c) : IsLineBreak(c);
    };
    size_t n = 0;
    while (n < pending_.size() && skip(pending_[n])) ++n;
    pending_.erase(0, n);
    if (pending_.empty()) return false;
    drop_ = Drop::kNothing;
    return true;
  }

  // The answer's start under Llama 3 with tools: '{' or <|python_tag|> opens the calls. Returns
  // false while undecided (pending_ then is held).
  bool DecideLlama3Start() {
    const size_t p = pending_.find_first_not_of(" \t\r\n");
    if (p == std::string::npos) return false;
    const std::string_view rest = std::string_view(pending_).substr(p);
    if (rest.starts_with(detail::kLlama3PythonTag)) {
      const size_t end = p + detail::kLlama3PythonTag.size();
      OpenBlock(detail::MakeLlama3Block(pending_.substr(0, end)));
      pending_.erase(0, end);
      return true;
    }
    if (rest.front() == '{') {
      OpenBlock(detail::MakeLlama3Block(pending_.substr(0, p)));
      pending_.erase(0, p);
      return true;
    }
    const bool think_here =
        think_allowed_ && (rest.starts_with(kThinkOpen) || kThinkOpen.starts_with(rest));
    if (detail::kLlama3PythonTag.starts_with(rest) && !think_here) return false;
    if (!think_here) llama3_start_ = false;
    return true;
  }

  bool PumpContent() {
    if (!DropLeading()) return false;
    if (llama3_start_) {
      if (!DecideLlama3Start()) return false;
      if (mode_ != Mode::kContent) return true;
    }
    // The earliest marker in the text.
    size_t at = std::string::npos;
    std::string_view marker;
    for (std::string_view m : {think_allowed_ ? kThinkOpen : std::string_view(), block_opener_}) {
      if (m.empty()) continue;
      const size_t i = pending_.find(m);
      if (i < at) at = i, marker = m;
    }
    if (at != std::string::npos) {
      const std::string_view before = std::string_view(pending_).substr(0, at);
      if (marker == kThinkOpen && before.find_first_not_of(" \t\r\n") != before.npos) {
        think_allowed_ = false;  // text came first: <think> is text now
        return true;
      }
      const size_t space = RunStart(before, before.size(), detail::IsJsonSpace);
      sink_.Content(before.substr(0, space));
      const std::string lead = pending_.substr(space, at + marker.size() - space);
      pending_.erase(0, at + marker.size());
      if (marker == kThinkOpen) {
        EnterReasoning();
      } else {
        OpenBlock(options_.format == ToolCallFormat::kHermes ? detail::MakeHermesBlock(lead)
                                                             : detail::MakeDeepSeekBlock());
      }
      return true;
    }
    EmitHeldContent();
    return false;
  }

  // Sends the content that cannot be the start of a marker, nor whitespace before one.
  void EmitHeldContent() {
    size_t cut = pending_.size();
    if (think_allowed_) cut = std::min(cut, PartialMarkerStart(pending_, kThinkOpen));
    if (!block_opener_.empty()) cut = std::min(cut, PartialMarkerStart(pending_, block_opener_));
    cut = RunStart(pending_, cut, detail::IsJsonSpace);
    cut = detail::Utf8SafeEnd(pending_, cut);
    if (cut == 0) return;
    think_allowed_ = false;  // non-whitespace text was sent: the answer has begun
    sink_.Content(std::string_view(pending_).substr(0, cut));
    pending_.erase(0, cut);
  }

  bool PumpReasoning() {
    if (!DropLeading()) return false;
    const size_t close = pending_.find(kThinkClose);
    if (close != std::string::npos) {
      sink_.Reasoning(std::string_view(pending_).substr(0, RunStart(pending_, close, IsLineBreak)));
      pending_.erase(0, close + kThinkClose.size());
      mode_ = Mode::kContent;
      drop_ = Drop::kLineBreaks;
      return true;
    }
    size_t cut = PartialMarkerStart(pending_, kThinkClose);
    cut = detail::Utf8SafeEnd(pending_, RunStart(pending_, cut, IsLineBreak));
    sink_.Reasoning(std::string_view(pending_).substr(0, cut));
    pending_.erase(0, cut);
    return false;
  }

  bool PumpBlock() {
    std::string after;
    const bool ended = block_->Feed(pending_, sink_, &after);
    pending_.clear();
    if (!ended) return false;
    block_.reset();
    mode_ = Mode::kContent;
    // Whitespace after calls is markup; after markup that was no call, it is text.
    drop_ = sink_.begun_calls() > calls_before_block_ ? Drop::kWhitespace : Drop::kNothing;
    pending_ = std::move(after);
    return true;
  }

  OutputParserOptions options_;
  EventSink sink_;
  Mode mode_ = Mode::kContent;
  Drop drop_ = Drop::kNothing;
  std::string pending_;            // text not yet sent: held back, or not yet looked at
  std::string_view block_opener_;  // the marker that opens a tool-call block (none for Llama 3)
  bool think_allowed_ = true;      // <think> still opens reasoning (the answer's start)
  bool llama3_start_ = false;      // Llama 3 calls may still begin (the answer's start)
  std::unique_ptr<ToolCallBlock> block_;
  int calls_before_block_ = 0;
};

}  // namespace

std::unique_ptr<OutputParser> MakeOutputParser(const OutputParserOptions& options, uint64_t seed) {
  return std::make_unique<Parser>(options, seed);
}

}  // namespace moetier::server
