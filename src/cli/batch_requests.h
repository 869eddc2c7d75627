// `moetier batch`'s input: one JSON object per line (JSONL), each a request for the engine.
// Every line is checked here, before anything loads, so a typo on line 900 is found in a
// millisecond rather than after the first 899 answers. JSON stays in the CLI layer: what comes
// out are native types that map one to one onto the engine's RequestOptions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"

namespace moetier::cli {

inline constexpr int64_t kDefaultBatchMaxNewTokens = 256;

// One line of the file. The fields, as the JSON spells them:
//   id                  a string or a number, unique in the file (required)
//   prompt | tokens     text, or an array of token ids: exactly one of them
//   max_new_tokens      whole number >= 0 (default 256)
//   temperature, top_k, top_p, min_p, repetition_penalty, seed   the sampler (default greedy;
//                       seed: whole number, absent or -1 = random)
//   stop                a string or an array of strings: generation ends before one of them
//   chat                bool: `prompt` is one user message for the chat template
//   ignore_eos          bool: generation goes on past end-of-sequence tokens
//   after               whole number >= 0: the request arrives after that many engine steps
// A field set to null is as if absent (id, prompt and tokens aside).
struct BatchRequest {
  int64_t line = 0;                   // 1-based line of the source, for every later error about it
  nlohmann::ordered_json id;          // a string or a number, written back as given
  std::optional<std::string> prompt;  // text (encoded with the tokenizer), or
  std::vector<int32_t> tokens;        // token ids (non-empty when there is no prompt)
  bool chat = false;
  int64_t max_new_tokens = kDefaultBatchMaxNewTokens;
  SamplerOptions sampler;         // its seed is used only when `seed` is set
  std::optional<uint64_t> seed;   // absent: a random seed
  std::vector<std::string> stop;  // never an empty string
  bool ignore_eos = false;
  int64_t after = 0;             // RequestOptions::arrival_step
  int logprobs = -1;             // RequestOptions::top_logprobs (-1: none)
  bool prompt_logprobs = false;  // needs logprobs

  // The request reads the model's tokenizer before it runs (a text prompt, stop strings).
  bool NeedsTokenizer() const { return prompt.has_value() || !stop.empty(); }
};

// Parses JSONL `text` read from `source` (the name errors start with). Blank lines are skipped;
// a UTF-8 byte order mark and CRLF line ends are accepted. An error is one line that names the
// line and the field: "<source>:7: field 'temperature' must be a number >= 0 (0: greedy), not
// -1"; unknown fields, invalid JSON, duplicate ids and a file without requests are errors too.
Expected<std::vector<BatchRequest>> ParseBatchRequests(std::string_view text,
                                                       const std::string& source);

// "<source>:<line>", which later errors about a request (its token ids against the model's
// vocabulary, its chat template) start with, so they read as the parser's own.
std::string RequestWhere(const std::string& source, const BatchRequest& request);

}  // namespace moetier::cli
