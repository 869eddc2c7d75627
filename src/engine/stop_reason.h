// Why a request's generation ended.
#pragma once

#include <string_view>

namespace moetier {

// kContextFull: the next token would not fit the sequence's context (the model's window, the
// KV cache). kCancelled also ends a request that failed (its event carries the error).
enum class StopReason { kEos, kStopString, kMaxTokens, kContextFull, kCancelled };

// The finish reason as the OpenAI API spells it: "stop" (an end-of-sequence token or a stop
// string), "length" (max tokens or the context's end) or "cancelled".
std::string_view StopReasonName(StopReason r);

}  // namespace moetier
