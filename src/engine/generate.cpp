#include "engine/generate.h"

namespace moetier {

std::string_view StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kEos:
    case StopReason::kStopString:
      return "stop";
    case StopReason::kMaxTokens:
    case StopReason::kContextFull:
      return "length";
    case StopReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

Expected<GenerateResult> Generate(Engine& engine, std::span<const int32_t> prompt,
                                  const GenerateOptions& options, const TokenCallback& on_token) {
  RequestOptions request;
  request.prompt.assign(prompt.begin(), prompt.end());
  request.sampler = options.sampler;
  request.max_new_tokens = options.max_new_tokens;
  request.stop_ids = options.stop_ids;
  GenerateResult out;
  Status error;
  RequestId id = 0;
  bool stopped = false;
  id = engine.Submit(std::move(request), [&](const RequestEvent& e) {
    if (e.kind == RequestEvent::Kind::kToken) {
      out.ids.push_back(e.token);
      if (on_token && !stopped && !on_token(e.token)) {
        stopped = true;
        engine.Cancel(id);
      }
      return;
    }
    out.reason = stopped ? StopReason::kCancelled : e.reason;
    out.usage = e.usage;
    out.timings = e.timings;
    error = e.status;
  });
  engine.RunUntilIdle();
  if (!error.ok()) return error;
  return out;
}

}  // namespace moetier
