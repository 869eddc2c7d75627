#include "server/openai_api.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "engine/logprobs.h"
#include "engine/sampler.h"

namespace moetier::server::openai {

namespace {

// Ordered, so a tool's schema keeps its keys' order (the template renders it as given).
using Json = nlohmann::ordered_json;
using OJson = nlohmann::ordered_json;

// OpenAI's ranges for the sampling fields.
constexpr double kMaxTemperature = 2.0;
constexpr double kMaxOccurrencePenalty = 2.0;
// More stop strings than any client sends (OpenAI allows 4); each is matched against every
// piece of output, so the count is bounded.
constexpr size_t kMaxStopStrings = 16;
// The legacy completions endpoint's max_tokens when none is given, as OpenAI documents it.
constexpr int64_t kCompletionsDefaultMaxTokens = 16;

// A refusal naming the field; the caller returns it.
Status Refuse(RequestError* error, std::string param, const std::string& what) {
  error->http_status = 400;
  error->message = param.empty() ? what : param + ": " + what;
  error->param = std::move(param);
  return Status::Error(error->message);
}

// Refuse, for the readers that return false on a refusal.
bool Bad(RequestError* error, std::string param, const std::string& what) {
  Refuse(error, std::move(param), what);
  return false;
}

// Reads one request's fields; every accessor returns false after recording the error.
class Fields {
 public:
  Fields(const Json& body, RequestError* error) : body_(body), error_(error) {}

  // The field, or nullptr when absent or null (null means absent, as clients send it).
  const Json* Get(const char* name) const {
    auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  bool Bool(const char* name, bool& out) {
    const Json* v = Get(name);
    if (v == nullptr) return true;
    if (!v->is_boolean()) return Fail(name, "must be true or false");
    out = v->get<bool>();
    return true;
  }

  // A finite number in [lo, hi].
  bool Number(const char* name, double lo, double hi, std::optional<double>& out) {
    const Json* v = Get(name);
    if (v == nullptr) return true;
    if (!v->is_number()) return Fail(name, "must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
      return Fail(name, "must be between " + Fmt(lo) + " and " + Fmt(hi));
    out = d;
    return true;
  }

  // An integer in [lo, hi].
  bool Integer(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
    const Json* v = Get(name);
    if (v == nullptr) return true;
    // No bound is worth reading as 19 digits: "a whole number of at least 1".
    const std::string range =
        hi == std::numeric_limits<int64_t>::max()
            ? "must be a whole number of at least " + std::to_string(lo)
            : "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo)))
        return Fail(name, range);
      out = static_cast<int64_t>(u);
      return true;
    }
    if (!v->is_number_integer()) return Fail(name, range);
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) return Fail(name, range);
    out = i;
    return true;
  }

  // Any 64-bit integer, signed or not (a negative one keeps its bits).
  bool Seed(const char* name, std::optional<uint64_t>& out) {
    const Json* v = Get(name);
    if (v == nullptr) return true;
    if (v->is_number_unsigned()) {
      out = v->get<uint64_t>();
    } else if (v->is_number_integer()) {
      out = static_cast<uint64_t>(v->get<int64_t>());
    } else {
      return Fail(name, "must be an integer");
    }
    return true;
  }

  bool Fail(const std::string& param, const std::string& what) {
    Refuse(error_, param, what);
    return false;
  }

 private:
  static std::string Fmt(double d) {
    std::string s = std::to_string(d);
    while (s.size() > 1 && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  const Json& body_;
  RequestError* error_;
};

// A message's content: a string, or a list of text parts (joined).
bool ReadContent(const Json& m, const std::string& where, bool required, std::string& out,
                 RequestError* error) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    if (required) return Bad(error, where + ".content", "is required");
    return true;
  }
  if (it->is_string()) {
    out = it->get<std::string>();
    return true;
  }
  if (!it->is_array())
    return Bad(error, where + ".content", "must be a string or a list of text parts");
  for (size_t j = 0; j < it->size(); ++j) {
    const Json& part = (*it)[j];
    const std::string at = where + ".content[" + std::to_string(j) + "]";
    if (!part.is_object()) return Bad(error, at, "must be an object");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text")
      return Bad(error, at + ".type", "only \"text\" parts are supported");
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return Bad(error, at + ".text", "must be a string");
    out += text->get<std::string>();
  }
  return true;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}].
bool ReadToolCalls(const Json& calls, const std::string& where, std::vector<ToolCall>& out,
                   RequestError* error) {
  if (!calls.is_array()) return Bad(error, where, "must be a list");
  for (size_t k = 0; k < calls.size(); ++k) {
    const Json& c = calls[k];
    const std::string at = where + "[" + std::to_string(k) + "]";
    if (!c.is_object()) return Bad(error, at, "must be an object");
    ToolCall call;
    if (auto id = c.find("id"); id != c.end() && !id->is_null()) {
      if (!id->is_string()) return Bad(error, at + ".id", "must be a string");
      call.id = id->get<std::string>();
    }
    auto f = c.find("function");
    if (f == c.end() || !f->is_object())
      return Bad(error, at + ".function", "must be an object with name and arguments");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
      return Bad(error, at + ".function.name", "must be a non-empty string");
    call.name = name->get<std::string>();
    auto args = f->find("arguments");
    if (args == f->end() || args->is_null()) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();
    } else if (args->is_object()) {
      call.arguments = args->dump();
    } else {
      return Bad(error, at + ".function.arguments", "must be a JSON object in a string");
    }
    out.push_back(std::move(call));
  }
  return true;
}

std::optional<ChatMessage::Role> RoleOf(const std::string& role) {
  if (role == "system" || role == "developer") return ChatMessage::Role::kSystem;
  if (role == "user") return ChatMessage::Role::kUser;
  if (role == "assistant") return ChatMessage::Role::kAssistant;
  if (role == "tool") return ChatMessage::Role::kTool;
  return std::nullopt;
}

bool ReadMessage(const Json& m, size_t i, ChatMessage& out, RequestError* error) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return Bad(error, where, "must be an object");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return Bad(error, where + ".role", "must be a string");
  const auto r = RoleOf(role->get<std::string>());
  if (!r)
    return Bad(error, where + ".role", "must be one of system, developer, user, assistant, tool");
  out.role = *r;
  const bool assistant = out.role == ChatMessage::Role::kAssistant;
  if (!ReadContent(m, where, /*required=*/!assistant, out.content, error)) return false;
  if (assistant) {
    for (const char* key : {"reasoning_content", "reasoning"}) {
      auto it = m.find(key);
      if (it == m.end() || it->is_null()) continue;
      if (!it->is_string()) return Bad(error, where + "." + key, "must be a string");
      out.reasoning_content = it->get<std::string>();
    }
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!ReadToolCalls(*calls, where + ".tool_calls", out.tool_calls, error)) return false;
    }
  }
  if (out.role == ChatMessage::Role::kTool) {
    auto id = m.find("tool_call_id");
    if (id == m.end() || !id->is_string())
      return Bad(error, where + ".tool_call_id", "must be a string (the call answered)");
    out.tool_call_id = id->get<std::string>();
  }
  if (auto name = m.find("name"); name != m.end() && !name->is_null()) {
    if (!name->is_string()) return Bad(error, where + ".name", "must be a string");
    out.name = name->get<std::string>();
  }
  return true;
}

bool ReadMessages(const Fields& f, ChatRequest& r, RequestError* error) {
  const Json* messages = f.Get("messages");
  if (messages == nullptr || !messages->is_array() || messages->empty())
    return Bad(error, "messages", "must be a non-empty list of messages");
  r.messages.resize(messages->size());
  for (size_t i = 0; i < messages->size(); ++i)
    if (!ReadMessage((*messages)[i], i, r.messages[i], error)) return false;
  return true;
}

bool ReadTools(const Fields& f, ChatRequest& r, RequestError* error) {
  const Json* tools = f.Get("tools");
  if (tools == nullptr) return true;
  if (!tools->is_array()) return Bad(error, "tools", "must be a list");
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return Bad(error, at, "must be an object");
    auto type = t.find("type");
    if (type != t.end() && !type->is_null() && (!type->is_string() || *type != "function"))
      return Bad(error, at + ".type", "must be \"function\"");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return Bad(error, at + ".function", "must be an object");
    ToolDefinition d;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      return Bad(error, at + ".function.name", "must be a non-empty string");
    d.name = name->get<std::string>();
    if (auto desc = fn->find("description"); desc != fn->end() && !desc->is_null()) {
      if (!desc->is_string()) return Bad(error, at + ".function.description", "must be a string");
      d.description = desc->get<std::string>();
    }
    if (auto params = fn->find("parameters"); params != fn->end() && !params->is_null()) {
      if (!params->is_object())
        return Bad(error, at + ".function.parameters", "must be a JSON Schema object");
      d.parameters = *params;
    }
    r.tools.push_back(std::move(d));
  }
  return true;
}

bool ReadToolChoice(const Fields& f, ChatRequest& r, RequestError* error) {
  const Json* c = f.Get("tool_choice");
  if (c == nullptr) return true;
  if (c->is_string()) {
    const std::string s = c->get<std::string>();
    if (s == "auto")
      r.tool_choice = ToolChoice::kAuto;
    else if (s == "none")
      r.tool_choice = ToolChoice::kNone;
    else if (s == "required")
      r.tool_choice = ToolChoice::kRequired;
    else
      return Bad(error, "tool_choice",
                 "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                 "\"function\": {\"name\": ...}}");
  } else if (c->is_object()) {
    auto fn = c->find("function");
    const Json* name = nullptr;
    if (fn != c->end() && fn->is_object()) {
      auto n = fn->find("name");
      if (n != fn->end()) name = &*n;
    }
    if (name == nullptr || !name->is_string())
      return Bad(error, "tool_choice.function.name", "must be a string");
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = name->get<std::string>();
    bool known = false;
    for (const ToolDefinition& t : r.tools) known = known || t.name == r.tool_choice_name;
    if (!known) return Bad(error, "tool_choice.function.name", "names no function given in tools");
  } else {
    return Bad(error, "tool_choice", "must be a string or an object");
  }
  if (r.tool_choice == ToolChoice::kRequired && r.tools.empty())
    return Bad(error, "tool_choice", "\"required\" needs tools");
  return true;
}

bool ReadStop(const Fields& f, SamplingParams& s, RequestError* error) {
  const Json* stop = f.Get("stop");
  if (stop == nullptr) return true;
  if (stop->is_string()) {
    s.stop.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > kMaxStopStrings)
      return Bad(error, "stop", "at most " + std::to_string(kMaxStopStrings) + " strings");
    for (const Json& v : *stop) {
      if (!v.is_string()) return Bad(error, "stop", "must be a string or a list of strings");
      s.stop.push_back(v.get<std::string>());
    }
  } else {
    return Bad(error, "stop", "must be a string or a list of strings");
  }
  std::erase_if(s.stop, [](const std::string& x) { return x.empty(); });
  return true;
}

// logit_bias: {"token id": bias}, each bias in [-100, 100] (the ids against the vocabulary are
// the service's to check).
bool ReadLogitBias(Fields& f, SamplingParams& s) {
  const Json* bias = f.Get("logit_bias");
  if (bias == nullptr) return true;
  if (!bias->is_object())
    return f.Fail("logit_bias", "must be an object mapping token ids (as strings) to biases");
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    const std::optional<int32_t> id = LogitBiasTokenId(it.key());
    if (!id) return f.Fail("logit_bias", "\"" + it.key() + "\" is not a token id");
    if (!it->is_number() || !std::isfinite(it->get<double>()) ||
        std::fabs(it->get<double>()) > kMaxLogitBias)
      return f.Fail("logit_bias",
                    "the bias of token " + it.key() + " must be a number between -100 and 100");
    s.logit_bias.emplace_back(*id, static_cast<float>(it->get<double>()));
  }
  return true;
}

// The fields both endpoints share: sampling, limits, streaming, n.
bool ReadSampling(Fields& f, ParsedRequest& p, Endpoint endpoint, RequestError* error) {
  SamplingParams& s = p.request.sampling;
  std::optional<double> temperature, top_p, min_p, presence, frequency, repetition;
  std::optional<int64_t> max_tokens, max_completion, top_k, n;
  constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
  if (!f.Number("temperature", 0.0, kMaxTemperature, temperature) ||
      !f.Number("top_p", 0.0, 1.0, top_p) || !f.Number("min_p", 0.0, 1.0, min_p) ||
      !f.Number("presence_penalty", -kMaxOccurrencePenalty, kMaxOccurrencePenalty, presence) ||
      !f.Number("frequency_penalty", -kMaxOccurrencePenalty, kMaxOccurrencePenalty, frequency) ||
      !f.Number("repetition_penalty", 0.0, std::numeric_limits<double>::max(), repetition) ||
      !f.Integer("max_tokens", 1, kIntMax, max_tokens) ||
      !f.Integer("max_completion_tokens", 1, kIntMax, max_completion) ||
      !f.Integer("top_k", -1, std::numeric_limits<int32_t>::max(), top_k) ||
      !f.Seed("seed", s.seed) || !f.Integer("n", 1, 1, n) || !f.Bool("stream", p.stream) ||
      !ReadStop(f, s, error))
    return false;
  if (top_p && *top_p == 0.0) return f.Fail("top_p", "must be greater than 0");
  if (repetition && *repetition == 0.0)
    return f.Fail("repetition_penalty", "must be greater than 0");
  if (temperature) s.temperature = static_cast<float>(*temperature);
  if (top_p) s.top_p = static_cast<float>(*top_p);
  if (min_p) s.min_p = static_cast<float>(*min_p);
  if (presence) s.presence_penalty = static_cast<float>(*presence);
  if (frequency) s.frequency_penalty = static_cast<float>(*frequency);
  if (repetition) s.repetition_penalty = static_cast<float>(*repetition);
  if (top_k) s.top_k = static_cast<int32_t>(std::max<int64_t>(*top_k, 0));  // -1: off
  s.max_tokens = max_completion ? max_completion : max_tokens;
  if (!s.max_tokens && endpoint == Endpoint::kCompletions)
    s.max_tokens = kCompletionsDefaultMaxTokens;
  if (const Json* so = f.Get("stream_options")) {
    if (!so->is_object()) return f.Fail("stream_options", "must be an object");
    auto usage = so->find("include_usage");
    if (usage != so->end() && !usage->is_null()) {
      if (!usage->is_boolean())
        return f.Fail("stream_options.include_usage", "must be true or false");
      p.include_usage = usage->get<bool>();
    }
  }
  if (!ReadLogitBias(f, s)) return false;
  if (const Json* rf = f.Get("response_format")) {
    auto type = rf->is_object() ? rf->find("type") : rf->end();
    if (!rf->is_object() || type == rf->end() || !type->is_string() || *type != "text")
      return f.Fail("response_format",
                    "only {\"type\": \"text\"} is supported (no JSON mode or schemas)");
  }
  return true;
}

bool ReadChat(Fields& f, ParsedRequest& p, RequestError* error) {
  ChatRequest& r = p.request;
  if (!ReadMessages(f, r, error) || !ReadTools(f, r, error) || !ReadToolChoice(f, r, error) ||
      !f.Bool("parallel_tool_calls", r.parallel_tool_calls))
    return false;
  if (const Json* kw = f.Get("chat_template_kwargs")) {
    if (!kw->is_object()) return f.Fail("chat_template_kwargs", "must be an object");
    r.template_kwargs = *kw;
  }
  bool logprobs = false;
  std::optional<int64_t> top;
  if (!f.Bool("logprobs", logprobs) || !f.Integer("top_logprobs", 0, kMaxTopLogprobs, top))
    return false;
  if (top && !logprobs) return f.Fail("top_logprobs", "needs \"logprobs\": true");
  if (logprobs) r.top_logprobs = static_cast<int>(top.value_or(0));
  return true;
}

// The completions endpoint's own fields: logprobs (the alternatives per token), echo, and those
// it refuses rather than ignore, since they would change the answer.
bool ReadCompletionFields(Fields& f, ChatRequest& r) {
  std::optional<int64_t> logprobs, best_of;
  bool echo = false;
  if (!f.Integer("logprobs", 0, kMaxTopLogprobs, logprobs) || !f.Bool("echo", echo) ||
      !f.Integer("best_of", 1, 1, best_of))
    return false;
  if (logprobs) r.top_logprobs = static_cast<int>(*logprobs);
  r.echo = echo;
  if (const Json* suffix = f.Get("suffix"); suffix != nullptr && *suffix != "")
    return f.Fail("suffix", "is not supported (no text after the insertion point)");
  return true;
}

// A non-empty list of token ids (integers from 0 to INT32_MAX; the vocabulary is checked later).
bool ReadTokenIds(const Json& list, std::vector<int32_t>& out) {
  if (!list.is_array() || list.empty()) return false;
  for (const Json& v : list) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > std::numeric_limits<int32_t>::max())
      return false;
    out.push_back(static_cast<int32_t>(v.get<uint64_t>()));
  }
  return true;
}

// A string, a list of one string, token ids, or a list of one list of token ids.
bool ReadPrompt(Fields& f, ChatRequest& r) {
  const Json* prompt = f.Get("prompt");
  r.raw_prompt = true;
  if (prompt != nullptr && prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
    return true;
  }
  if (prompt != nullptr && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.prompt = (*prompt)[0].get<std::string>();
    return true;
  }
  if (prompt != nullptr && prompt->is_array() && !prompt->empty()) {
    const Json& ids = prompt->size() == 1 && (*prompt)[0].is_array() ? (*prompt)[0] : *prompt;
    if (ReadTokenIds(ids, r.prompt_ids)) return true;
  }
  return f.Fail("prompt",
                "must be a string or token ids (or a list of one of them: one prompt a request)");
}

Expected<ParsedRequest> Parse(Endpoint endpoint, std::string_view body, RequestError* error) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Refuse(error, "", "the body is not valid JSON (or not valid UTF-8)");
  if (!j.is_object()) return Refuse(error, "", "the body must be a JSON object");
  ParsedRequest p;
  Fields f(j, error);
  if (const Json* model = f.Get("model")) {
    if (!model->is_string()) return Refuse(error, "model", "must be a string");
    p.request.model = model->get<std::string>();
  }
  const bool ok = endpoint == Endpoint::kChatCompletions
                      ? ReadChat(f, p, error)
                      : ReadPrompt(f, p.request) && ReadCompletionFields(f, p.request);
  if (!ok || !ReadSampling(f, p, endpoint, error)) return Status::Error(error->message);
  return p;
}

// ---- responses -------------------------------------------------------------------------------

std::string Dump(const OJson& j) {
  // Model text is valid UTF-8 (the decoder replaces broken sequences); replace keeps a bad byte
  // from ever becoming an exception.
  return j.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

std::string Sse(const OJson& j) {
  return "data: " + Dump(j) + "\n\n";
}

const char* FinishName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
    case FinishReason::kCancelled:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
    case FinishReason::kError:
      return "error";
  }
  return "stop";
}

OJson UsageJson(const ChatUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// A log-probability as JSON: OpenAI's -9999 for a token that cannot follow (-inf); null for
// none (NaN: an echoed prompt's first token).
OJson LogprobJson(float logprob) {
  constexpr double kImpossible = -9999.0;
  if (std::isnan(logprob)) return nullptr;
  return std::isfinite(logprob) ? static_cast<double>(logprob) : kImpossible;
}

// chat: {"token", "logprob", "bytes"}, the token's bytes as numbers (its text may end inside a
// UTF-8 character; the JSON string then holds U+FFFD there).
OJson ChatTokenJson(const TokenText& t) {
  OJson bytes = OJson::array();
  for (unsigned char c : t.token) bytes.push_back(c);
  return {{"token", t.token}, {"logprob", LogprobJson(t.logprob)}, {"bytes", std::move(bytes)}};
}

// chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...], "refusal": null}.
OJson ChatLogprobsJson(const std::vector<TokenLogprobEntry>& entries) {
  OJson content = OJson::array();
  for (const TokenLogprobEntry& e : entries) {
    OJson item = ChatTokenJson(e.chosen);
    OJson top = OJson::array();
    for (const TokenText& t : e.top) top.push_back(ChatTokenJson(t));
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// The characters of `token` in the answer's text: its UTF-8 lead bytes (a character split
// between tokens counts where it begins).
int64_t CharactersOf(const std::string& token) {
  int64_t n = 0;
  for (unsigned char c : token) n += (c & 0xC0) != 0x80;
  return n;
}

// completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"},
// offsets in characters of the answer, from `offset` on (advanced past these tokens).
OJson CompletionLogprobsJson(const std::vector<TokenLogprobEntry>& entries, int64_t& offset) {
  OJson tokens = OJson::array(), logprobs = OJson::array(), top = OJson::array(),
        offsets = OJson::array();
  for (const TokenLogprobEntry& e : entries) {
    tokens.push_back(e.chosen.token);
    logprobs.push_back(LogprobJson(e.chosen.logprob));
    OJson alternatives = OJson::object();
    for (const TokenText& t : e.top) alternatives[t.token] = LogprobJson(t.logprob);
    const bool none = std::isnan(e.chosen.logprob);  // OpenAI: null, not {}, for the first
    top.push_back(none ? OJson(nullptr) : std::move(alternatives));
    offsets.push_back(offset);
    offset += CharactersOf(e.chosen.token);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

const char* ErrorType(int http_status) {
  if (http_status == 401) return "authentication_error";
  if (http_status == 404) return "not_found_error";
  if (http_status == 429) return "rate_limit_error";
  if (http_status >= 500) return "server_error";
  return "invalid_request_error";
}

}  // namespace

Expected<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                     RequestError* error) {
  RequestError local;
  if (error == nullptr) error = &local;
  try {
    return Parse(endpoint, body, error);
  } catch (const std::exception& e) {
    // Every field is type-checked before it is read; this is the last line, not the way.
    return Refuse(error, "", std::string("the body could not be read: ") + e.what());
  }
}

std::string ErrorBody(const RequestError& error) {
  OJson e = {{"message", error.message},
             {"type", ErrorType(error.http_status)},
             {"param", error.param.empty() ? OJson(nullptr) : OJson(error.param)},
             {"code", nullptr}};
  return Dump(OJson{{"error", std::move(e)}});
}

ResponseWriter::ResponseWriter(Endpoint endpoint, std::string id, std::string model,
                               int64_t created, bool include_usage, bool logprobs)
    : endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      include_usage_(include_usage),
      logprobs_(logprobs) {}

OJson ResponseWriter::TakeLogprobs() {
  if (!logprobs_) return nullptr;
  OJson j = endpoint_ == Endpoint::kChatCompletions
                ? ChatLogprobsJson(logprobs_pending_)
                : CompletionLogprobsJson(logprobs_pending_, text_offset_);
  logprobs_pending_.clear();
  return j;
}

namespace {

// The object every chunk of a stream shares, with `choice` as its one choice.
OJson ChunkJson(Endpoint endpoint, const std::string& id, const std::string& model, int64_t created,
                OJson choice, bool include_usage) {
  OJson j = {{"id", id},
             {"object",
              endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion"},
             {"created", created},
             {"model", model},
             {"choices", OJson::array({std::move(choice)})}};
  if (include_usage) j["usage"] = nullptr;  // only the last chunk carries it
  return j;
}

OJson DeltaChoice(OJson delta) {
  return {
      {"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
}

OJson TextChoice(const std::string& text, const char* finish) {
  return {{"text", text},
          {"index", 0},
          {"logprobs", nullptr},
          {"finish_reason", finish == nullptr ? OJson(nullptr) : OJson(finish)}};
}

}  // namespace

std::string ResponseWriter::Chunk(const ChatEvent& event) {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  auto chunk = [&](OJson choice) {
    return Sse(ChunkJson(endpoint_, id_, model_, created_, std::move(choice), include_usage_));
  };
  // A chunk with text or a call carries the log-probabilities of the tokens since the last one.
  auto with_logprobs = [&](OJson choice) {
    if (!logprobs_pending_.empty()) choice["logprobs"] = TakeLogprobs();
    return chunk(std::move(choice));
  };
  std::string out;
  if (chat && !sent_role_ && event.kind != ChatEvent::Kind::kFinished) {
    sent_role_ = true;
    out += chunk(DeltaChoice({{"role", "assistant"}, {"content", ""}}));
  }
  switch (event.kind) {
    case ChatEvent::Kind::kContent:
    case ChatEvent::Kind::kReasoning: {
      if (event.text.empty()) break;
      if (!chat) {
        out += with_logprobs(TextChoice(event.text, nullptr));
        break;
      }
      const char* key = event.kind == ChatEvent::Kind::kContent ? "content" : "reasoning_content";
      out += with_logprobs(DeltaChoice({{key, event.text}}));
      break;
    }
    case ChatEvent::Kind::kLogprobs:
      logprobs_pending_.push_back(event.logprobs);
      break;
    case ChatEvent::Kind::kToolCallBegin: {
      tool_calls_.push_back(ToolCall{event.tool_call.id, event.tool_call.name, ""});
      OJson call = {{"index", event.tool_index},
                    {"id", event.tool_call.id},
                    {"type", "function"},
                    {"function", {{"name", event.tool_call.name}, {"arguments", ""}}}};
      out += with_logprobs(DeltaChoice({{"tool_calls", OJson::array({std::move(call)})}}));
      break;
    }
    case ChatEvent::Kind::kToolCallArgs:
    case ChatEvent::Kind::kToolCallEnd: {
      // What of the arguments was not streamed yet (an End whose Args pieces fell short).
      std::string piece = event.text;
      if (event.tool_index >= 0 && static_cast<size_t>(event.tool_index) < tool_calls_.size()) {
        std::string& sent = tool_calls_[static_cast<size_t>(event.tool_index)].arguments;
        if (event.kind == ChatEvent::Kind::kToolCallEnd) {
          const std::string& whole = event.tool_call.arguments;
          piece = whole.size() > sent.size() && whole.compare(0, sent.size(), sent) == 0
                      ? whole.substr(sent.size())
                      : "";
        }
        sent += piece;
      }
      if (piece.empty()) break;
      OJson call = {{"index", event.tool_index}, {"function", {{"arguments", piece}}}};
      out += with_logprobs(DeltaChoice({{"tool_calls", OJson::array({std::move(call)})}}));
      break;
    }
    case ChatEvent::Kind::kFinished: {
      if (event.finish_reason == FinishReason::kError) {
        out += "data: " + ErrorBody(RequestError{500, event.error, ""}) + "\n\n";
        out += "data: [DONE]\n\n";
        break;
      }
      const char* finish = FinishName(event.finish_reason);
      OJson choice = chat ? DeltaChoice(OJson::object()) : TextChoice("", finish);
      if (chat) choice["finish_reason"] = finish;
      out += with_logprobs(std::move(choice));  // tokens that gave no text (an end token)
      if (include_usage_) {
        OJson last = ChunkJson(endpoint_, id_, model_, created_, nullptr, false);
        last["choices"] = OJson::array();
        last["usage"] = UsageJson(event.usage);
        out += Sse(last);
      }
      out += "data: [DONE]\n\n";
      break;
    }
  }
  return out;
}

void ResponseWriter::Add(const ChatEvent& event) {
  switch (event.kind) {
    case ChatEvent::Kind::kContent:
      content_ += event.text;
      break;
    case ChatEvent::Kind::kReasoning:
      // Completions have no place for reasoning: it stays in the text, as generated.
      (endpoint_ == Endpoint::kChatCompletions ? reasoning_ : content_) += event.text;
      break;
    case ChatEvent::Kind::kToolCallBegin:
    case ChatEvent::Kind::kToolCallArgs:
      break;  // the call is taken whole at its end
    case ChatEvent::Kind::kToolCallEnd:
      tool_calls_.push_back(event.tool_call);
      break;
    case ChatEvent::Kind::kLogprobs:
      logprobs_pending_.push_back(event.logprobs);
      break;
    case ChatEvent::Kind::kFinished:
      finish_ = event.finish_reason;
      usage_ = event.usage;
      if (event.finish_reason == FinishReason::kError) content_ = event.error;
      break;
  }
}

std::string ResponseWriter::Body() {
  if (finish_ == FinishReason::kError) return ErrorBody(RequestError{500, content_, ""});
  OJson logprobs = TakeLogprobs();
  const char* finish = FinishName(finish_);
  OJson j = {
      {"id", id_},
      {"object", endpoint_ == Endpoint::kChatCompletions ? "chat.completion" : "text_completion"},
      {"created", created_},
      {"model", model_}};
  if (endpoint_ == Endpoint::kCompletions) {
    j["choices"] = OJson::array({TextChoice(content_, finish)});
    j["choices"][0]["logprobs"] = std::move(logprobs);
  } else {
    OJson message = {
        {"role", "assistant"},
        {"content", content_.empty() && !tool_calls_.empty() ? OJson(nullptr) : OJson(content_)}};
    if (!reasoning_.empty()) message["reasoning_content"] = reasoning_;
    if (!tool_calls_.empty()) {
      OJson calls = OJson::array();
      for (const ToolCall& c : tool_calls_)
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      message["tool_calls"] = std::move(calls);
    }
    j["choices"] = OJson::array({{{"index", 0},
                                  {"message", std::move(message)},
                                  {"logprobs", std::move(logprobs)},
                                  {"finish_reason", finish}}});
  }
  j["usage"] = UsageJson(usage_);
  return Dump(j);
}

}  // namespace moetier::server::openai
