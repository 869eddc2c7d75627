// Llama 3 JSON tool calls: when tools are offered, an answer that begins with a JSON object
// (optionally after <|python_tag|>) is a call,
//   {"name": NAME, "parameters": {...}}
// and several calls are separated by ';'. The calls end with the last object; text after it
// is content. An answer whose object is not a call is content, whole.
#include "server/tool_calls_formats.h"

namespace moetier::server::detail {
namespace {

class Llama3Block final : public ToolCallBlock {
 public:
  explicit Llama3Block(std::string_view lead) : lead_(lead) {}

  bool Feed(std::string_view text, EventSink& sink, std::string* after) override {
    pending_.append(text);
    while (true) {
      if (in_call_) {
        std::string leftover;
        const bool ended = call_->Feed(pending_, sink, &leftover);
        pending_.clear();
        if (!ended) return false;
        if (call_->not_a_call()) {
          sink.Content(lead_ + call_->raw());
          *after = std::move(leftover);
          return true;
        }
        pending_ = std::move(leftover);
        in_call_ = false;
      }
      // Between calls: whitespace, then ';' and the next call, or the end of the calls.
      const size_t p = pending_.find_first_not_of(" \t\r\n");
      if (p == std::string::npos) return false;
      if (pending_[p] != ';') {
        after->assign(pending_, p);
        return true;
      }
      pending_.erase(0, p + 1);
      StartCall();
    }
  }

  void Finish(EventSink& sink) override {
    if (in_call_ && !call_->Close(sink)) sink.Content(lead_ + call_->raw());
  }

 private:
  void StartCall() {
    call_ = std::make_unique<JsonCallParser>(JsonCallParser::End::kAtObjectClose);
    in_call_ = true;
    lead_.clear();  // only the answer's first call came after the lead
  }

  std::string lead_;
  std::string pending_;  // text after a call, until a ';' or other text decides
  bool in_call_ = true;
  std::unique_ptr<JsonCallParser> call_ =
      std::make_unique<JsonCallParser>(JsonCallParser::End::kAtObjectClose);
};

}  // namespace

std::unique_ptr<ToolCallBlock> MakeLlama3Block(std::string_view lead) {
  return std::make_unique<Llama3Block>(lead);
}

}  // namespace moetier::server::detail
