#include "cli/batch_requests.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

namespace moetier::cli {

namespace {

using Json = nlohmann::ordered_json;

// What an error quotes of a value or a name: at most this many bytes, so that a line holding a
// megabyte-long prompt still gives a readable one-line error.
constexpr size_t kMaxQuotedBytes = 40;

constexpr const char* kFieldList =
    "id, prompt, tokens, max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, "
    "seed, stop, chat, ignore_eos, after, logprobs, prompt_logprobs, logit_bias";

// `s` cut to kMaxQuotedBytes at a UTF-8 character boundary, "..." marking the cut.
std::string Shortened(std::string s) {
  if (s.size() <= kMaxQuotedBytes) return s;
  size_t n = kMaxQuotedBytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s + "...";
}

// A value as the file spells it (escaped: one line whatever it holds), shortened.
std::string Shown(const Json& v) {
  return Shortened(v.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace));
}

// A key, escaped as JSON escapes it but without the quotes, shortened.
std::string ShownKey(const std::string& key) {
  const std::string quoted =
      Json(key).dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
  return Shortened(quoted.substr(1, quoted.size() - 2));
}

// Printable ASCII only: the parser's messages quote raw bytes of the line.
std::string Printable(std::string_view s) {
  std::string out;
  for (const char c : s.substr(0, 4 * kMaxQuotedBytes)) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u >= 0x7f ? '?' : c);
  }
  if (s.size() > 4 * kMaxQuotedBytes) out += "...";
  return out;
}

Status FieldError(std::string_view field, const std::string& must, const Json& v) {
  return Status::Error("field '" + std::string(field) + "' must be " + must + ", not " + Shown(v));
}

// A whole number in [min, max] (a JSON integer; 2.0 is not one).
Expected<int64_t> WholeField(const Json& v, std::string_view field, int64_t min, int64_t max,
                             const std::string& range) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (min <= 0 || u >= static_cast<uint64_t>(min)) {
      if (u <= static_cast<uint64_t>(max)) return static_cast<int64_t>(u);
    }
  } else if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i >= min && i <= max) return i;
  }
  return FieldError(field, "a whole number " + range, v);
}

struct RealRange {
  double min, max;
  bool min_open;
  std::string words;  // "a number >= 0 (0: greedy)"
};

// A number within `r` that a float holds (the sampler's type).
Expected<float> RealField(const Json& v, std::string_view field, const RealRange& r) {
  if (v.is_number()) {
    const auto d = v.get<double>();
    const bool above_min = r.min_open ? d > r.min : d >= r.min;
    if (std::isfinite(d) && above_min && d <= r.max && d <= FLT_MAX) return static_cast<float>(d);
  }
  return FieldError(field, r.words, v);
}

Expected<bool> BoolField(const Json& v, std::string_view field) {
  if (!v.is_boolean()) return FieldError(field, "true or false", v);
  return v.get<bool>();
}

Status ReadTokens(const Json& v, BatchRequest& r) {
  if (!v.is_array() || v.empty()) return FieldError("tokens", "a non-empty array of token ids", v);
  r.tokens.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& t = v[i];
    const bool ok = t.is_number_unsigned() ? t.get<uint64_t>() <= INT32_MAX
                                           : t.is_number_integer() && t.get<int64_t>() >= 0 &&
                                                 t.get<int64_t>() <= INT32_MAX;
    if (!ok)
      return Status::Error("field 'tokens' item " + std::to_string(i) +
                           " must be a token id (a whole number from 0 to 2147483647), not " +
                           Shown(t));
    r.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return OkStatus();
}

Status ReadStop(const Json& v, BatchRequest& r) {
  const char* must = "a non-empty string or an array of them";
  if (v.is_string()) {
    r.stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const Json& s : v) {
      if (!s.is_string()) return FieldError("stop", must, v);
      r.stop.push_back(s.get<std::string>());
    }
  } else {
    return FieldError("stop", must, v);
  }
  for (const std::string& s : r.stop)
    if (s.empty()) return FieldError("stop", must, v);
  return OkStatus();
}

Status ReadSeed(const Json& v, BatchRequest& r) {
  if (v.is_number_unsigned()) {
    r.seed = v.get<uint64_t>();
    return OkStatus();
  }
  if (v.is_number_integer() && v.get<int64_t>() == -1) return OkStatus();  // random
  return FieldError("seed", "a whole number >= 0 (or -1: random)", v);
}

// {"token id": bias, ...}: OpenAI's logit_bias, each bias in [-100, 100] (the ids against the
// vocabulary: the engine's to check).
Status ReadLogitBias(const Json& v, BatchRequest& r) {
  const char* must = "an object of token ids (as strings) to biases in [-100, 100]";
  if (!v.is_object()) return FieldError("logit_bias", must, v);
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::optional<int32_t> id = LogitBiasTokenId(it.key());
    if (!id)
      return Status::Error("field 'logit_bias' key '" + ShownKey(it.key()) +
                           "' must be a token id (a whole number from 0 to 2147483647)");
    MT_ASSIGN_OR_RETURN(const float bias,
                        RealField(it.value(), "logit_bias", {-100, 100, false, must}));
    r.sampler.logit_bias.push_back({*id, bias});
  }
  return OkStatus();
}

// One field of a request into `r`; the fields that are not the sampler's or the prompt's.
Status ReadField(const std::string& key, const Json& v, BatchRequest& r) {
  SamplerOptions& s = r.sampler;
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  if (key == "id") {
    if (!v.is_string() && !v.is_number()) return FieldError(key, "a string or a number", v);
    r.id = v;
  } else if (key == "prompt") {
    if (!v.is_string()) return FieldError(key, "a string", v);
    r.prompt = v.get<std::string>();
  } else if (key == "tokens") {
    return ReadTokens(v, r);
  } else if (v.is_null()) {
    return OkStatus();  // an optional field left at its default
  } else if (key == "max_new_tokens") {
    MT_ASSIGN_OR_RETURN(r.max_new_tokens, WholeField(v, key, 0, kInt64Max, ">= 0"));
  } else if (key == "temperature") {
    MT_ASSIGN_OR_RETURN(s.temperature, RealField(v, key,
                                                 {0, FLT_MAX, false,
                                                  "a number >= 0 "
                                                  "(0: greedy)"}));
  } else if (key == "top_k") {
    MT_ASSIGN_OR_RETURN(const int64_t k,
                        WholeField(v, key, 0, INT32_MAX, "from 0 to 2147483647 (0: off)"));
    s.top_k = static_cast<int32_t>(k);
  } else if (key == "top_p") {
    MT_ASSIGN_OR_RETURN(s.top_p, RealField(v, key, {0, 1, true, "a number in (0, 1] (1: off)"}));
  } else if (key == "min_p") {
    MT_ASSIGN_OR_RETURN(s.min_p, RealField(v, key, {0, 1, false, "a number in [0, 1] (0: off)"}));
  } else if (key == "repetition_penalty") {
    MT_ASSIGN_OR_RETURN(s.repetition_penalty,
                        RealField(v, key, {0, FLT_MAX, true, "a number > 0 (1: off)"}));
  } else if (key == "seed") {
    return ReadSeed(v, r);
  } else if (key == "stop") {
    return ReadStop(v, r);
  } else if (key == "chat") {
    MT_ASSIGN_OR_RETURN(r.chat, BoolField(v, key));
  } else if (key == "ignore_eos") {
    MT_ASSIGN_OR_RETURN(r.ignore_eos, BoolField(v, key));
  } else if (key == "after") {
    MT_ASSIGN_OR_RETURN(r.after, WholeField(v, key, 0, kInt64Max, ">= 0 (engine steps)"));
  } else if (key == "logprobs") {
    MT_ASSIGN_OR_RETURN(const int64_t n, WholeField(v, key, 0, kMaxTopLogprobs,
                                                    "from 0 to " + std::to_string(kMaxTopLogprobs) +
                                                        " (the alternatives given a token)"));
    r.logprobs = static_cast<int>(n);
  } else if (key == "prompt_logprobs") {
    MT_ASSIGN_OR_RETURN(r.prompt_logprobs, BoolField(v, key));
  } else if (key == "logit_bias") {
    return ReadLogitBias(v, r);
  } else {
    return Status::Error("unknown field '" + ShownKey(key) + "' (the fields are " + kFieldList +
                         ")");
  }
  return OkStatus();
}

// The parser's message without its "[json.exception…] parse error at line 1, " prefix (the line
// is always 1: it parses one line).
std::string JsonErrorText(const Json::exception& e) {
  std::string what = e.what();
  if (const size_t close = what.find("] "); what.starts_with("[json.") && close != what.npos)
    what = what.substr(close + 2);
  const std::string prefix = "parse error at line 1, ";
  if (what.starts_with(prefix)) what = what.substr(prefix.size());
  return Printable(what);
}

// Parses one line into a JSON object, refusing a key that appears twice (the parser would keep
// the last one without a word).
Expected<Json> ParseLine(std::string_view line) {
  std::set<std::string> keys;
  std::string duplicate, last_key;
  const Json::parser_callback_t on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key) {
      last_key = parsed.get<std::string>();
      if (!keys.insert(last_key).second && duplicate.empty()) duplicate = last_key;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(line.begin(), line.end(), on_event);
  } catch (const Json::out_of_range& e) {  // a number beyond a double: 1e999
    if (last_key.empty()) return Status::Error("not valid JSON: " + JsonErrorText(e));
    return Status::Error("field '" + ShownKey(last_key) + "' must be a finite number (" +
                         JsonErrorText(e) + ")");
  } catch (const Json::exception& e) {
    return Status::Error("not valid JSON: " + JsonErrorText(e));
  }
  if (!j.is_object())
    return Status::Error(std::string("must be a JSON object such as {\"id\": 1, \"prompt\": "
                                     "\"Hello\"}, not ") +
                         (j.is_array() ? "an array" : Shown(j)));
  if (!duplicate.empty())
    return Status::Error("field '" + ShownKey(duplicate) + "' is given twice");
  return j;
}

Expected<BatchRequest> ParseRequest(std::string_view line, int64_t line_no) {
  MT_ASSIGN_OR_RETURN(const Json j, ParseLine(line));
  BatchRequest r;
  r.line = line_no;
  for (const auto& [key, value] : j.items()) MT_RETURN_IF_ERROR(ReadField(key, value, r));
  if (r.id.is_null())
    return Status::Error(
        "field 'id' is missing (each request needs an id of its own, a string "
        "or a number)");
  const bool has_tokens = !r.tokens.empty();
  if (r.prompt && has_tokens)
    return Status::Error("fields 'prompt' and 'tokens' are both given; give one of them");
  if (!r.prompt && !has_tokens)
    return Status::Error("field 'prompt' (text) or 'tokens' (token ids) is missing");
  if (r.chat && has_tokens)
    return Status::Error(
        "field 'chat' renders a 'prompt' with the chat template; it cannot "
        "apply to 'tokens'");
  if (r.prompt_logprobs && r.logprobs < 0)
    return Status::Error(
        "field 'prompt_logprobs' needs 'logprobs' (how many alternatives to give a token, 0 "
        "for none)");
  if (r.seed) r.sampler.seed = *r.seed;
  return r;
}

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

}  // namespace

std::string RequestWhere(const std::string& source, const BatchRequest& request) {
  return source + ":" + std::to_string(request.line);
}

Expected<std::vector<BatchRequest>> ParseBatchRequests(std::string_view text,
                                                       const std::string& source) {
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  if (text.starts_with(kBom)) text.remove_prefix(kBom.size());
  std::vector<BatchRequest> requests;
  std::map<Json, int64_t> line_of_id;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (IsBlank(line)) continue;
    if (line.ends_with('\r')) line.remove_suffix(1);
    const std::string where = source + ":" + std::to_string(line_no);
    auto r = ParseRequest(line, line_no);
    if (!r.ok()) return r.status().WithContext(where);
    const auto [it, fresh] = line_of_id.emplace(r->id, line_no);
    if (!fresh)
      return Status::Error(where + ": field 'id': " + Shown(r->id) + " is already the id of line " +
                           std::to_string(it->second) + " (ids must be unique)");
    requests.push_back(std::move(*r));
  }
  if (requests.empty())
    return Status::Error(source +
                         ": no requests (one JSON object per line, such as {\"id\": 1, "
                         "\"prompt\": \"Hello\", \"max_new_tokens\": 32})");
  return requests;
}

}  // namespace moetier::cli
