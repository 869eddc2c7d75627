// Fuzz target for `moetier batch`'s JSONL request parser: any bytes must give requests or a
// Status, never a crash, a hang or a sanitizer report. Requests that parse must keep the
// parser's promises (each line one prompt or a non-empty token list, ids unique, every value in
// its range), and an error must be one line naming the source.
//
// Input: the file's text. Seeds: fuzz/corpus/batch_requests/ (valid files using every field,
// and broken lines of each kind).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "cli/batch_requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz.jsonl";
  auto requests = moetier::cli::ParseBatchRequests(text, source);
  if (!requests.ok()) {
    const std::string& e = requests.message();
    if (e.find('\n') != std::string::npos || !e.starts_with(source)) __builtin_trap();
    return 0;
  }
  if (requests->empty()) __builtin_trap();
  std::set<int64_t> lines;
  for (const moetier::cli::BatchRequest& r : *requests) {
    const bool one_prompt = r.prompt.has_value() != !r.tokens.empty();
    const bool id_ok = r.id.is_string() || r.id.is_number();
    const moetier::SamplerOptions& s = r.sampler;
    const bool sampler_ok = std::isfinite(s.temperature) && s.temperature >= 0 && s.top_k >= 0 &&
                            s.top_p > 0 && s.top_p <= 1 && s.min_p >= 0 && s.min_p <= 1 &&
                            std::isfinite(s.repetition_penalty) && s.repetition_penalty > 0;
    bool tokens_ok = true;
    for (const int32_t t : r.tokens) tokens_ok = tokens_ok && t >= 0;
    bool stops_ok = true;
    for (const std::string& stop : r.stop) stops_ok = stops_ok && !stop.empty();
    const bool in_order = r.line >= 1 && lines.insert(r.line).second && r.line >= *lines.rbegin() &&
                          r.max_new_tokens >= 0 && r.after >= 0;
    if (!one_prompt || !id_ok || !sampler_ok || !tokens_ok || !stops_ok || !in_order ||
        (r.chat && !r.prompt))
      __builtin_trap();
    (void)moetier::cli::RequestWhere(source, r);
  }
  return 0;
}
