#include "server/anthropic_api.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moetier::server::anthropic {
namespace {

using Json = nlohmann::ordered_json;

// Deepest nesting of arrays and objects a body may hold. Real requests nest a tool's schema a
// few dozen levels at most; the limit keeps the recursive copy and dump of a hostile body
// (16 MiB of "[") off the end of the stack.
constexpr int kMaxJsonDepth = 128;

// Most keys one object of a body may hold. ordered_json (kept for the order of a schema's
// properties, which the prompt shows) finds a key by a linear scan, so an object of n keys costs
// n²/2 compares to parse. Real requests hold tens; at this limit a 16 MiB body of the widest
// objects parses about a third slower than one of small objects (at 1024, three times slower).
constexpr size_t kMaxObjectKeys = 256;

// Joins the text blocks of one content array (and of a system prompt given as blocks).
constexpr std::string_view kTextBlockSeparator = "\n";

// Said before a tool result's text when the client marked it is_error, so the model can tell a
// failed call from its output (the chat templates have no field for it).
constexpr std::string_view kToolErrorPrefix = "Error: ";

// ---------------------------------------------------------------------------------------------
// Reading the body
// ---------------------------------------------------------------------------------------------

// Why `body` is too deep or too wide to parse (kMaxJsonDepth, kMaxObjectKeys), or "" when it
// is not. A scan of the bytes (strings skipped), not a parse: nlohmann's parser callback, the
// other place to count, rescans an array at the end of each of its elements.
std::string BodyTooComplex(std::string_view body) {
  std::vector<std::pair<bool, size_t>> open;  // per open bracket: an object?, its commas
  bool in_string = false, escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (open.size() >= static_cast<size_t>(kMaxJsonDepth)) {
        return "nested deeper than " + std::to_string(kMaxJsonDepth) +
               " arrays/objects; flatten the request";
      }
      open.emplace_back(c == '{', 0);
    } else if ((c == '}' || c == ']') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back().first &&
               ++open.back().second >= kMaxObjectKeys) {
      return "an object holds more than " + std::to_string(kMaxObjectKeys) + " keys; send fewer";
    }
  }
  return {};
}

std::string Path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}
std::string Path(const std::string& parent, size_t index) {
  return parent + "." + std::to_string(index);
}

// Parses a request body into a ParsedRequest; the first fault found is kept with its field.
class RequestParser {
 public:
  explicit RequestParser(bool count_tokens) : count_tokens_(count_tokens) {}

  Status Parse(const Json& body, ParsedRequest* out);
  const std::string& field() const { return field_; }

 private:
  Status Fail(const std::string& field, std::string_view what) {
    field_ = field;
    return Status::Error(field + ": " + std::string(what));
  }
  Status WrongType(const std::string& field, const Json& v, std::string_view expected) {
    return Fail(field, "must be " + std::string(expected) + ", not " + v.type_name());
  }

  Status ReadString(const Json& v, const std::string& field, std::string* out);
  Status ReadBool(const Json& v, const std::string& field, bool* out);
  Status ReadInteger(const Json& v, const std::string& field, int64_t lo, int64_t hi, int64_t* out);
  Status ReadFloat(const Json& v, const std::string& field, double lo, double hi, bool lo_inclusive,
                   float* out);
  // A string, or an array of {"type": "text", "text"} blocks joined.
  Status ReadText(const Json& v, const std::string& field, std::string* out);
  // A text block: {"type": "text", "text": ...}; other types are an error.
  Status ReadTextBlock(const Json& block, const std::string& field, std::string* out);

  Status ParseTopLevel(const Json& body, ChatRequest* r, bool* stream);
  Status ParseSampling(const Json& body, SamplingParams* s);
  Status ParseMessages(const Json& messages, std::vector<ChatMessage>* out);
  Status ParseUserMessage(const Json& content, const std::string& field,
                          std::vector<ChatMessage>* out);
  Status ParseAssistantMessage(const Json& content, const std::string& field, ChatMessage* out);
  Status ParseToolResult(const Json& block, const std::string& field, ChatMessage* out);
  Status ParseToolUse(const Json& block, const std::string& field, ToolCall* out);
  Status ParseTools(const Json& tools, std::vector<ToolDefinition>* out);
  Status ParseToolChoice(const Json& choice, ChatRequest* r);
  Status ParseThinking(const Json& thinking, ChatRequest* r);
  // The template's enable_thinking (templates without it ignore it).
  static void SetThinking(bool enabled, ChatRequest* r);

  bool count_tokens_;
  std::string field_;
  std::vector<ToolCall> calls_seen_;  // tool_use blocks so far, to name the tools' results
};

Status RequestParser::ReadString(const Json& v, const std::string& field, std::string* out) {
  if (!v.is_string()) return WrongType(field, v, "a string");
  *out = v.get<std::string>();
  return OkStatus();
}

Status RequestParser::ReadBool(const Json& v, const std::string& field, bool* out) {
  if (!v.is_boolean()) return WrongType(field, v, "true or false");
  *out = v.get<bool>();
  return OkStatus();
}

Status RequestParser::ReadInteger(const Json& v, const std::string& field, int64_t lo, int64_t hi,
                                  int64_t* out) {
  const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return Fail(field, "must be " + range);
    *out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    *out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      return Fail(field, "must be " + range);
    }
    *out = static_cast<int64_t>(d);
  } else {
    return WrongType(field, v, range);
  }
  if (*out < lo || *out > hi) return Fail(field, "must be " + range);
  return OkStatus();
}

Status RequestParser::ReadFloat(const Json& v, const std::string& field, double lo, double hi,
                                bool lo_inclusive, float* out) {
  const std::string range =
      std::string(lo_inclusive ? "[" : "(") + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v.is_number()) return WrongType(field, v, "a number in " + range);
  const double d = v.get<double>();
  if (!(lo_inclusive ? d >= lo : d > lo) || !(d <= hi)) {
    return Fail(field, "must be in " + range);
  }
  *out = static_cast<float>(d);
  return OkStatus();
}

Status RequestParser::ReadTextBlock(const Json& block, const std::string& field, std::string* out) {
  if (!block.is_object()) return WrongType(field, block, "an object (a content block)");
  const auto type = block.find("type");
  if (type == block.end()) return Fail(Path(field, "type"), "required");
  std::string type_name;
  MT_RETURN_IF_ERROR(ReadString(*type, Path(field, "type"), &type_name));
  if (type_name == "image" || type_name == "document") {
    return Fail(Path(field, "type"),
                "\"" + type_name + "\" content is not supported by this server; send text");
  }
  if (type_name != "text") {
    return Fail(Path(field, "type"), "must be \"text\" here, not \"" + type_name + "\"");
  }
  const auto text = block.find("text");
  if (text == block.end()) return Fail(Path(field, "text"), "required");
  return ReadString(*text, Path(field, "text"), out);
}

Status RequestParser::ReadText(const Json& v, const std::string& field, std::string* out) {
  if (v.is_string()) return ReadString(v, field, out);
  if (!v.is_array()) return WrongType(field, v, "a string or an array of text blocks");
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    std::string text;
    MT_RETURN_IF_ERROR(ReadTextBlock(v[i], Path(field, i), &text));
    if (i > 0) out->append(kTextBlockSeparator);
    out->append(text);
  }
  return OkStatus();
}

Status RequestParser::Parse(const Json& body, ParsedRequest* out) {
  if (!body.is_object()) return WrongType("body", body, "a JSON object");
  ChatRequest& r = out->request;
  MT_RETURN_IF_ERROR(ParseTopLevel(body, &r, &out->stream));
  MT_RETURN_IF_ERROR(ParseSampling(body, &r.sampling));
  if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    MT_RETURN_IF_ERROR(ParseTools(*it, &r.tools));
  }
  if (const auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    MT_RETURN_IF_ERROR(ParseToolChoice(*it, &r));
  }
  if (const auto it = body.find("thinking"); it != body.end() && !it->is_null()) {
    MT_RETURN_IF_ERROR(ParseThinking(*it, &r));
  } else {
    // As Anthropic's API: no extended thinking unless asked for (a Qwen3 template would
    // otherwise think by default).
    SetThinking(false, &r);
  }
  return OkStatus();
}

// model, system, messages, stream (metadata and unknown fields are ignored).
Status RequestParser::ParseTopLevel(const Json& body, ChatRequest* r, bool* stream) {
  const auto model = body.find("model");
  if (model == body.end()) return Fail("model", "required (the model's name, echoed back)");
  MT_RETURN_IF_ERROR(ReadString(*model, "model", &r->model));

  if (const auto it = body.find("system"); it != body.end() && !it->is_null()) {
    ChatMessage system;
    system.role = ChatMessage::Role::kSystem;
    MT_RETURN_IF_ERROR(ReadText(*it, "system", &system.content));
    r->messages.push_back(std::move(system));
  }

  const auto messages = body.find("messages");
  if (messages == body.end()) return Fail("messages", "required (the conversation)");
  MT_RETURN_IF_ERROR(ParseMessages(*messages, &r->messages));

  if (const auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    MT_RETURN_IF_ERROR(ReadBool(*it, "stream", stream));
  }
  return OkStatus();
}

// max_tokens, temperature, top_p, top_k, stop_sequences.
Status RequestParser::ParseSampling(const Json& body, SamplingParams* s) {
  const auto max_tokens = body.find("max_tokens");
  if (max_tokens != body.end() && !max_tokens->is_null()) {
    int64_t n = 0;
    MT_RETURN_IF_ERROR(
        ReadInteger(*max_tokens, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &n));
    s->max_tokens = n;
  } else if (!count_tokens_) {
    return Fail("max_tokens", "required (the most tokens to generate, at least 1)");
  }
  if (const auto it = body.find("temperature"); it != body.end() && !it->is_null()) {
    MT_RETURN_IF_ERROR(ReadFloat(*it, "temperature", 0.0, 1.0, true, &s->temperature));
  }
  if (const auto it = body.find("top_p"); it != body.end() && !it->is_null()) {
    MT_RETURN_IF_ERROR(ReadFloat(*it, "top_p", 0.0, 1.0, false, &s->top_p));
  }
  if (const auto it = body.find("top_k"); it != body.end() && !it->is_null()) {
    int64_t k = 0;
    MT_RETURN_IF_ERROR(ReadInteger(*it, "top_k", 0, std::numeric_limits<int32_t>::max(), &k));
    s->top_k = static_cast<int32_t>(k);
  }
  if (const auto it = body.find("stop_sequences"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return WrongType("stop_sequences", *it, "an array of strings");
    for (size_t i = 0; i < it->size(); ++i) {
      std::string stop;
      MT_RETURN_IF_ERROR(ReadString((*it)[i], Path("stop_sequences", i), &stop));
      if (stop.empty()) return Fail(Path("stop_sequences", i), "must not be empty");
      s->stop.push_back(std::move(stop));
    }
  }
  return OkStatus();
}

Status RequestParser::ParseMessages(const Json& messages, std::vector<ChatMessage>* out) {
  if (!messages.is_array()) return WrongType("messages", messages, "an array of messages");
  if (messages.empty()) return Fail("messages", "must hold at least one message");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = Path("messages", i);
    const Json& m = messages[i];
    if (!m.is_object()) return WrongType(field, m, "an object with role and content");
    const auto role = m.find("role");
    if (role == m.end()) return Fail(Path(field, "role"), "required (\"user\" or \"assistant\")");
    std::string role_name;
    MT_RETURN_IF_ERROR(ReadString(*role, Path(field, "role"), &role_name));
    const auto content = m.find("content");
    if (content == m.end()) return Fail(Path(field, "content"), "required");
    if (role_name == "user") {
      MT_RETURN_IF_ERROR(ParseUserMessage(*content, Path(field, "content"), out));
    } else if (role_name == "assistant") {
      ChatMessage assistant;
      assistant.role = ChatMessage::Role::kAssistant;
      MT_RETURN_IF_ERROR(ParseAssistantMessage(*content, Path(field, "content"), &assistant));
      out->push_back(std::move(assistant));
    } else {
      return Fail(Path(field, "role"), "must be \"user\" or \"assistant\", not \"" + role_name +
                                           "\" (a system prompt goes in the top-level \"system\")");
    }
  }
  return OkStatus();
}

// A user turn: its tool_result blocks become tool messages (in order), then its text, if any,
// one user message.
Status RequestParser::ParseUserMessage(const Json& content, const std::string& field,
                                       std::vector<ChatMessage>* out) {
  ChatMessage user;
  user.role = ChatMessage::Role::kUser;
  if (content.is_string()) {
    user.content = content.get<std::string>();
    out->push_back(std::move(user));
    return OkStatus();
  }
  if (!content.is_array()) return WrongType(field, content, "a string or an array of blocks");
  std::vector<std::string> texts;
  size_t n_tool_results = 0;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block_field = Path(field, i);
    const Json& block = content[i];
    if (block.is_object() && block.contains("type") && block["type"] == "tool_result") {
      ChatMessage tool;
      MT_RETURN_IF_ERROR(ParseToolResult(block, block_field, &tool));
      out->push_back(std::move(tool));
      ++n_tool_results;
      continue;
    }
    std::string text;
    MT_RETURN_IF_ERROR(ReadTextBlock(block, block_field, &text));
    texts.push_back(std::move(text));
  }
  if (texts.empty() && n_tool_results > 0) return OkStatus();
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) user.content.append(kTextBlockSeparator);
    user.content.append(texts[i]);
  }
  out->push_back(std::move(user));
  return OkStatus();
}

// {"type": "tool_result", "tool_use_id", "content": string | text blocks, "is_error"}.
Status RequestParser::ParseToolResult(const Json& block, const std::string& field,
                                      ChatMessage* out) {
  out->role = ChatMessage::Role::kTool;
  const auto id = block.find("tool_use_id");
  if (id == block.end()) return Fail(Path(field, "tool_use_id"), "required");
  MT_RETURN_IF_ERROR(ReadString(*id, Path(field, "tool_use_id"), &out->tool_call_id));
  for (auto it = calls_seen_.rbegin(); it != calls_seen_.rend(); ++it) {
    if (it->id == out->tool_call_id) {
      out->name = it->name;
      break;
    }
  }
  if (const auto c = block.find("content"); c != block.end() && !c->is_null()) {
    MT_RETURN_IF_ERROR(ReadText(*c, Path(field, "content"), &out->content));
  }
  bool is_error = false;
  if (const auto e = block.find("is_error"); e != block.end() && !e->is_null()) {
    MT_RETURN_IF_ERROR(ReadBool(*e, Path(field, "is_error"), &is_error));
  }
  if (is_error) out->content = std::string(kToolErrorPrefix) + out->content;
  return OkStatus();
}

// An assistant turn: text, thinking (its reasoning_content), tool_use (its tool calls);
// redacted_thinking carries nothing this server can read and is dropped.
Status RequestParser::ParseAssistantMessage(const Json& content, const std::string& field,
                                            ChatMessage* out) {
  if (content.is_string()) {
    out->content = content.get<std::string>();
    return OkStatus();
  }
  if (!content.is_array()) return WrongType(field, content, "a string or an array of blocks");
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block_field = Path(field, i);
    const Json& block = content[i];
    const std::string type =
        block.is_object() && block.contains("type") && block["type"].is_string()
            ? block["type"].get<std::string>()
            : std::string();
    if (type == "tool_use") {
      ToolCall call;
      MT_RETURN_IF_ERROR(ParseToolUse(block, block_field, &call));
      calls_seen_.push_back(call);
      out->tool_calls.push_back(std::move(call));
    } else if (type == "thinking") {
      const auto thinking = block.find("thinking");
      if (thinking == block.end()) return Fail(Path(block_field, "thinking"), "required");
      std::string text;
      MT_RETURN_IF_ERROR(ReadString(*thinking, Path(block_field, "thinking"), &text));
      if (!out->reasoning_content.empty()) out->reasoning_content.append(kTextBlockSeparator);
      out->reasoning_content.append(text);
    } else if (type == "redacted_thinking") {
      continue;
    } else {
      std::string text;
      MT_RETURN_IF_ERROR(ReadTextBlock(block, block_field, &text));
      if (!out->content.empty()) out->content.append(kTextBlockSeparator);
      out->content.append(text);
    }
  }
  return OkStatus();
}

// {"type": "tool_use", "id", "name", "input": {...}}: the input's JSON text becomes the
// call's arguments.
Status RequestParser::ParseToolUse(const Json& block, const std::string& field, ToolCall* out) {
  const auto id = block.find("id");
  if (id == block.end()) return Fail(Path(field, "id"), "required");
  MT_RETURN_IF_ERROR(ReadString(*id, Path(field, "id"), &out->id));
  const auto name = block.find("name");
  if (name == block.end()) return Fail(Path(field, "name"), "required");
  MT_RETURN_IF_ERROR(ReadString(*name, Path(field, "name"), &out->name));
  const auto input = block.find("input");
  if (input == block.end()) return Fail(Path(field, "input"), "required (an object)");
  if (!input->is_object()) return WrongType(Path(field, "input"), *input, "an object");
  out->arguments = input->dump(-1, ' ', false, Json::error_handler_t::replace);
  return OkStatus();
}

// [{"name", "description", "input_schema"}]; Anthropic's server tools (a "type" other than
// "custom") run on Anthropic's side and are refused.
Status RequestParser::ParseTools(const Json& tools, std::vector<ToolDefinition>* out) {
  if (!tools.is_array()) return WrongType("tools", tools, "an array of tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string field = Path("tools", i);
    const Json& t = tools[i];
    if (!t.is_object()) return WrongType(field, t, "an object with name and input_schema");
    if (const auto type = t.find("type"); type != t.end() && !type->is_null()) {
      std::string type_name;
      MT_RETURN_IF_ERROR(ReadString(*type, Path(field, "type"), &type_name));
      if (type_name != "custom") {
        return Fail(Path(field, "type"), "server tool \"" + type_name +
                                             "\" is not supported; define a custom tool with "
                                             "name and input_schema");
      }
    }
    ToolDefinition tool;
    const auto name = t.find("name");
    if (name == t.end()) return Fail(Path(field, "name"), "required");
    MT_RETURN_IF_ERROR(ReadString(*name, Path(field, "name"), &tool.name));
    if (tool.name.empty()) return Fail(Path(field, "name"), "must not be empty");
    if (const auto d = t.find("description"); d != t.end() && !d->is_null()) {
      MT_RETURN_IF_ERROR(ReadString(*d, Path(field, "description"), &tool.description));
    }
    const auto schema = t.find("input_schema");
    if (schema == t.end()) return Fail(Path(field, "input_schema"), "required (a JSON Schema)");
    if (!schema->is_object()) {
      return WrongType(Path(field, "input_schema"), *schema, "an object (a JSON Schema)");
    }
    tool.parameters = *schema;
    out->push_back(std::move(tool));
  }
  return OkStatus();
}

// {"type": auto | any | tool | none, "name" (tool), "disable_parallel_tool_use"}.
Status RequestParser::ParseToolChoice(const Json& choice, ChatRequest* r) {
  if (!choice.is_object()) return WrongType("tool_choice", choice, "an object with a type");
  const auto type = choice.find("type");
  if (type == choice.end()) return Fail("tool_choice.type", "required");
  std::string type_name;
  MT_RETURN_IF_ERROR(ReadString(*type, "tool_choice.type", &type_name));
  if (type_name == "auto") {
    r->tool_choice = ToolChoice::kAuto;
  } else if (type_name == "any") {
    r->tool_choice = ToolChoice::kRequired;
  } else if (type_name == "none") {
    r->tool_choice = ToolChoice::kNone;
  } else if (type_name == "tool") {
    r->tool_choice = ToolChoice::kNamed;
    const auto name = choice.find("name");
    if (name == choice.end()) return Fail("tool_choice.name", "required when type is \"tool\"");
    MT_RETURN_IF_ERROR(ReadString(*name, "tool_choice.name", &r->tool_choice_name));
    bool defined = false;
    for (const ToolDefinition& t : r->tools) defined = defined || t.name == r->tool_choice_name;
    if (!defined) {
      return Fail("tool_choice.name", "no tool named \"" + r->tool_choice_name + "\" in tools");
    }
  } else {
    return Fail("tool_choice.type",
                "must be \"auto\", \"any\", \"tool\" or \"none\", not \"" + type_name + "\"");
  }
  if (r->tool_choice != ToolChoice::kNone && r->tools.empty()) {
    return Fail("tool_choice", "needs tools (none were given)");
  }
  if (const auto d = choice.find("disable_parallel_tool_use"); d != choice.end() && !d->is_null()) {
    bool disable = false;
    MT_RETURN_IF_ERROR(ReadBool(*d, "tool_choice.disable_parallel_tool_use", &disable));
    r->parallel_tool_calls = !disable;
  }
  return OkStatus();
}

// {"type": "enabled", "budget_tokens"} | {"type": "disabled"} → the template's
// enable_thinking. The budget is checked, not enforced: max_tokens bounds the whole answer.
Status RequestParser::ParseThinking(const Json& thinking, ChatRequest* r) {
  if (!thinking.is_object()) return WrongType("thinking", thinking, "an object with a type");
  const auto type = thinking.find("type");
  if (type == thinking.end()) return Fail("thinking.type", "required");
  std::string type_name;
  MT_RETURN_IF_ERROR(ReadString(*type, "thinking.type", &type_name));
  bool enabled = false;
  if (type_name == "enabled") {
    enabled = true;
    if (const auto b = thinking.find("budget_tokens"); b != thinking.end() && !b->is_null()) {
      int64_t budget = 0;
      MT_RETURN_IF_ERROR(ReadInteger(*b, "thinking.budget_tokens", 1,
                                     std::numeric_limits<int32_t>::max(), &budget));
    }
  } else if (type_name != "disabled") {
    return Fail("thinking.type", "must be \"enabled\" or \"disabled\", not \"" + type_name + "\"");
  }
  SetThinking(enabled, r);
  return OkStatus();
}

void RequestParser::SetThinking(bool enabled, ChatRequest* r) {
  if (!r->template_kwargs.is_object()) r->template_kwargs = Json::object();
  r->template_kwargs["enable_thinking"] = enabled;
}

// ---------------------------------------------------------------------------------------------
// Writing the answer
// ---------------------------------------------------------------------------------------------

// Invalid UTF-8 in generated text (a token cut inside a character) is replaced, never thrown on.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Sse(std::string_view event, const Json& data) {
  std::string out = "event: ";
  out.append(event);
  out.append("\ndata: ");
  out.append(Dump(data));
  out.append("\n\n");
  return out;
}

// The error type Anthropic's clients map from an HTTP status.
std::string_view ErrorType(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return http_status >= 400 && http_status < 500 ? "invalid_request_error" : "api_error";
  }
}

Json ErrorJson(std::string_view type, const std::string& message) {
  return Json{{"type", "error"}, {"error", Json{{"type", type}, {"message", message}}}};
}

// The call ids the output parser makes ("call_…") wear Anthropic's prefix ("toolu_…"); ids are
// opaque to the template, so the client may send either back.
std::string ToolUseId(const std::string& call_id) {
  constexpr std::string_view kCallPrefix = "call_";
  if (call_id.rfind(kCallPrefix, 0) == 0) return "toolu_" + call_id.substr(kCallPrefix.size());
  return call_id;
}

// The tool input as an object; arguments that are not a JSON object (the parser only completes
// calls whose JSON parses, so this is defensive) or are as complex as no body may be give an
// empty one.
Json ToolInput(const std::string& arguments) {
  if (!BodyTooComplex(arguments).empty()) return Json::object();
  Json input = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : Json::object();
}

std::string_view StopReason(FinishReason finish, const std::string& stop_sequence) {
  switch (finish) {
    case FinishReason::kLength:
      return "max_tokens";
    case FinishReason::kToolCalls:
      return "tool_use";
    default:
      return stop_sequence.empty() ? "end_turn" : "stop_sequence";
  }
}

Json StopSequence(FinishReason finish, const std::string& stop_sequence) {
  if (finish != FinishReason::kStop || stop_sequence.empty()) return nullptr;
  return stop_sequence;
}

Json Usage(const ChatUsage& usage) {
  return Json{{"input_tokens", usage.prompt_tokens},
              {"output_tokens", usage.completion_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", usage.cached_tokens}};
}

}  // namespace

Expected<ParsedRequest> ParseRequest(std::string_view body, bool count_tokens,
                                     RequestError* error) {
  auto fail = [&](std::string field, std::string message) -> Status {
    if (error != nullptr) *error = RequestError{400, message, std::move(field)};
    return Status::Error(std::move(message));
  };
  if (const std::string why = BodyTooComplex(body); !why.empty()) {
    return fail("body", "body: " + why);
  }
  Json json;
  try {
    json = Json::parse(body);
  } catch (const Json::exception& e) {  // the parser's account says where the JSON broke
    return fail("body", std::string("body: not valid JSON: ") + e.what());
  }
  ParsedRequest parsed;
  RequestParser parser(count_tokens);
  if (Status s = parser.Parse(json, &parsed); !s.ok()) return fail(parser.field(), s.message());
  return parsed;
}

std::string ErrorBody(const RequestError& error) {
  return Dump(ErrorJson(ErrorType(error.http_status), error.message));
}

ResponseWriter::ResponseWriter(std::string id, std::string model)
    : id_(std::move(id)), model_(std::move(model)) {}

// Both modes keep blocks_ the same way; Events also says what to send as each changes.
std::string ResponseWriter::Events(const ChatEvent& event) {
  if (finished_) return {};
  std::string out;
  if (!started_) {
    started_ = true;
    Json message{{"id", id_},
                 {"type", "message"},
                 {"role", "assistant"},
                 {"model", model_},
                 {"content", Json::array()},
                 {"stop_reason", nullptr},
                 {"stop_sequence", nullptr},
                 {"usage", Usage(ChatUsage{event.usage.prompt_tokens, event.usage.cached_tokens,
                                           /*completion_tokens=*/0})}};
    out += Sse("message_start", Json{{"type", "message_start"}, {"message", message}});
  }
  switch (event.kind) {
    case ChatEvent::Kind::kContent:
    case ChatEvent::Kind::kReasoning: {
      if (event.text.empty()) break;
      const bool text = event.kind == ChatEvent::Kind::kContent;
      const Block::Type type = text ? Block::Type::kText : Block::Type::kThinking;
      if (open_block_ < 0 || blocks_[open_block_].type != type) {
        out += CloseBlock();
        out += OpenBlock(Block{type, "", {}});
      }
      blocks_[open_block_].text += event.text;
      Json delta = text ? Json{{"type", "text_delta"}, {"text", event.text}}
                        : Json{{"type", "thinking_delta"}, {"thinking", event.text}};
      out += Delta(std::move(delta));
      break;
    }
    case ChatEvent::Kind::kToolCallBegin:
      out += BeginToolUse(event.tool_index, event.tool_call);
      break;
    case ChatEvent::Kind::kToolCallArgs:
      out += ToolUseArgs(event.tool_index, event.text);
      break;
    case ChatEvent::Kind::kToolCallEnd:
      out += EndToolUse(event.tool_index, event.tool_call);
      break;
    case ChatEvent::Kind::kLogprobs:
      break;  // the Messages API has no log-probabilities (no request asks for them)
    case ChatEvent::Kind::kFinished:
      out += Finish(event);
      break;
  }
  return out;
}

void ResponseWriter::Add(const ChatEvent& event) {
  (void)Events(event);
}

std::string ResponseWriter::Body() const {
  if (finish_ == FinishReason::kError) {
    return Dump(ErrorJson("api_error", error_.empty() ? "generation failed" : error_));
  }
  Json content = Json::array();
  for (const Block& b : blocks_) {
    switch (b.type) {
      case Block::Type::kText:
        content.push_back(Json{{"type", "text"}, {"text", b.text}});
        break;
      case Block::Type::kThinking:
        content.push_back(Json{{"type", "thinking"}, {"thinking", b.text}, {"signature", ""}});
        break;
      case Block::Type::kToolUse:
        content.push_back(Json{{"type", "tool_use"},
                               {"id", ToolUseId(b.call.id)},
                               {"name", b.call.name},
                               {"input", ToolInput(b.call.arguments)}});
        break;
    }
  }
  const Json message{{"id", id_},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"model", model_},
                     {"content", std::move(content)},
                     {"stop_reason", StopReason(finish_, stop_sequence_)},
                     {"stop_sequence", StopSequence(finish_, stop_sequence_)},
                     {"usage", Usage(usage_)}};
  return Dump(message);
}

std::string ResponseWriter::OpenBlock(Block block) {
  blocks_.push_back(std::move(block));
  open_block_ = static_cast<int>(blocks_.size()) - 1;
  const Block& b = blocks_.back();
  Json start;
  switch (b.type) {
    case Block::Type::kText:
      start = Json{{"type", "text"}, {"text", ""}};
      break;
    case Block::Type::kThinking:
      start = Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
      break;
    case Block::Type::kToolUse:
      start = Json{{"type", "tool_use"},
                   {"id", ToolUseId(b.call.id)},
                   {"name", b.call.name},
                   {"input", Json::object()}};
      break;
  }
  return Sse("content_block_start", Json{{"type", "content_block_start"},
                                         {"index", open_block_},
                                         {"content_block", std::move(start)}});
}

std::string ResponseWriter::CloseBlock() {
  if (open_block_ < 0) return {};
  const int index = open_block_;
  open_block_ = -1;
  return Sse("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index}});
}

std::string ResponseWriter::Delta(Json delta) const {
  return Sse(
      "content_block_delta",
      Json{{"type", "content_block_delta"}, {"index", open_block_}, {"delta", std::move(delta)}});
}

std::string ResponseWriter::InputJsonDelta(const std::string& partial_json) {
  blocks_[open_block_].text += partial_json;
  return Delta(Json{{"type", "input_json_delta"}, {"partial_json", partial_json}});
}

std::string ResponseWriter::BeginToolUse(int tool_index, const ToolCall& call) {
  std::string out = CloseBlock();
  Block block{Block::Type::kToolUse, "", call};
  block.call.arguments.clear();
  out += OpenBlock(std::move(block));
  tool_blocks_.emplace_back(tool_index, open_block_);
  return out;
}

// Arguments stream into the open tool_use block; a piece for a call whose begin was not seen
// opens its block first (the parser always sends the begin, so this only guards the order).
std::string ResponseWriter::ToolUseArgs(int tool_index, const std::string& piece) {
  std::string out;
  if (!IsOpenTool(tool_index)) out += BeginToolUse(tool_index, ToolCall{});
  if (!piece.empty()) out += InputJsonDelta(piece);
  return out;
}

// The complete call: whatever of its arguments was not streamed yet is sent as the last
// delta, and the block closes.
std::string ResponseWriter::EndToolUse(int tool_index, const ToolCall& call) {
  std::string out;
  if (!IsOpenTool(tool_index)) out += BeginToolUse(tool_index, call);
  Block& block = blocks_[open_block_];
  const std::string& streamed = block.text;
  if (call.arguments.size() > streamed.size() && call.arguments.rfind(streamed, 0) == 0) {
    out += InputJsonDelta(call.arguments.substr(streamed.size()));
  } else if (streamed.empty() && !call.arguments.empty()) {
    out += InputJsonDelta(call.arguments);
  }
  Block& done = blocks_[open_block_];
  if (!call.id.empty()) done.call.id = call.id;
  if (!call.name.empty()) done.call.name = call.name;
  done.call.arguments = call.arguments.empty() ? done.text : call.arguments;
  out += CloseBlock();
  return out;
}

bool ResponseWriter::IsOpenTool(int tool_index) const {
  if (open_block_ < 0 || blocks_[open_block_].type != Block::Type::kToolUse) return false;
  for (const auto& [index, block] : tool_blocks_) {
    if (index == tool_index && block == open_block_) return true;
  }
  return false;
}

// message_delta (stop reason, usage) and message_stop; an error ends the stream with an error
// event instead, as Anthropic's clients expect.
std::string ResponseWriter::Finish(const ChatEvent& event) {
  finished_ = true;
  finish_ = event.finish_reason;
  stop_sequence_ = event.stop_sequence;
  usage_ = event.usage;
  error_ = event.error;
  std::string out = CloseBlock();
  if (finish_ == FinishReason::kError) {
    return out +
           Sse("error", ErrorJson("api_error", error_.empty() ? "generation failed" : error_));
  }
  out += Sse("message_delta",
             Json{{"type", "message_delta"},
                  {"delta", Json{{"stop_reason", StopReason(finish_, stop_sequence_)},
                                 {"stop_sequence", StopSequence(finish_, stop_sequence_)}}},
                  {"usage", Usage(usage_)}});
  out += Sse("message_stop", Json{{"type", "message_stop"}});
  return out;
}

}  // namespace moetier::server::anthropic
