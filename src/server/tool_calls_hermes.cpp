// Hermes / Qwen3 tool calls: each call is its own block,
//   <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
// and several may follow one another (with whitespace between) after some content. The call
// ends at its closing tag; text between the JSON object and the tag is ignored. The closing
// tag ends the call wherever it appears, even inside a JSON string (a model that writes
// "</tool_call>" meant to close).
#include "server/tool_calls_formats.h"

namespace moetier::server::detail {
namespace {

class HermesBlock final : public ToolCallBlock {
 public:
  explicit HermesBlock(std::string_view lead) : lead_(lead) {}

  bool Feed(std::string_view text, EventSink& sink, std::string* after) override {
    held_.append(text);
    std::string unused;
    const size_t close = held_.find(kHermesClose);
    if (close == std::string::npos) {
      const size_t keep = PartialMarkerStart(held_, kHermesClose);
      call_.Feed(std::string_view(held_).substr(0, keep), sink, &unused);
      held_.erase(0, keep);
      return false;
    }
    call_.Feed(std::string_view(held_).substr(0, close), sink, &unused);
    if (!call_.Close(sink)) {
      sink.Content(lead_ + call_.raw() + std::string(kHermesClose));
    }
    after->assign(held_, close + kHermesClose.size());
    held_.clear();
    return true;
  }

  void Finish(EventSink& sink) override {
    std::string unused;
    call_.Feed(held_, sink, &unused);
    held_.clear();
    if (!call_.Close(sink)) sink.Content(lead_ + call_.raw());
  }

 private:
  std::string lead_;  // the whitespace and <tool_call> that opened the block
  std::string held_;  // body text that may be the start of the closing tag
  JsonCallParser call_{JsonCallParser::End::kAtBodyEnd};
};

}  // namespace

std::unique_ptr<ToolCallBlock> MakeHermesBlock(std::string_view lead) {
  return std::make_unique<HermesBlock>(lead);
}

}  // namespace moetier::server::detail
