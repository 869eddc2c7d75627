#include "server/chat_service.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <utility>

#include "engine/stop_strings.h"
#include "engine/text_generation.h"
#include "model/generation_config.h"
#include "server/output_parser.h"

namespace moetier::server {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

const char* RoleName(ChatMessage::Role role) {
  switch (role) {
    case ChatMessage::Role::kSystem:
      return "system";
    case ChatMessage::Role::kUser:
      return "user";
    case ChatMessage::Role::kAssistant:
      return "assistant";
    case ChatMessage::Role::kTool:
      return "tool";
  }
  return "user";
}

// What the rendering of a request gives: the prompt text, and how the answer begins.
struct RenderedPrompt {
  std::string text;
  bool add_special_tokens = false;  // a raw prompt is tokenized as tokenizer(text) does
  bool starts_in_reasoning = false;
  // Text appended to the prompt that opens a tool call (tool_choice required / named): the
  // answer continues it, so the output parser is fed it first.
  std::string answer_prefix;
};

// The per-request instruction that asks for a call when tool_choice is required or named (the
// template renders the tools; the model is told it must call one).
std::string CallInstruction(const ChatRequest& r) {
  if (r.tool_choice == ToolChoice::kNamed)
    return "You must call the function \"" + r.tool_choice_name + "\" now.";
  return "You must call one or more of the functions now.";
}

// The text that opens a call in `format`, which the model then completes: the arguments of a
// named function, or just the call's opening markup. Empty where the format has no opening that
// can be written ahead (DeepSeek-V3's markers are special tokens the decoder skips).
std::string CallOpening(ToolCallFormat format, const ChatRequest& r) {
  const bool named = r.tool_choice == ToolChoice::kNamed;
  // Quoted and escaped (a byte that is not UTF-8 becomes U+FFFD rather than an exception).
  const std::string name =
      Json(r.tool_choice_name).dump(-1, ' ', false, Json::error_handler_t::replace);
  switch (format) {
    case ToolCallFormat::kHermes:
      return named ? "<tool_call>\n{\"name\": " + name + ", \"arguments\": " : "<tool_call>\n";
    case ToolCallFormat::kLlama3Json:
      return named ? "{\"name\": " + name + ", \"parameters\": " : "{\"name\": \"";
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kNone:
      return {};
  }
  return {};
}

bool EndsInsideThink(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  return open != std::string::npos && prompt.find("</think>", open) == std::string::npos;
}

// The counters every request adds to; shared with the requests' sinks, which may outlive the
// service by a step.
struct Counters {
  mutable std::mutex mu;
  ServiceMetrics metrics;  // the monotonic counters (gauges are computed in Metrics())
  int64_t in_flight = 0;
  std::set<RequestId> ids;  // in flight
};

// One request's state on the engine thread: stop strings, the output parser, what was sent.
struct RequestState {
  Engine* engine = nullptr;
  std::shared_ptr<Counters> counters;
  ChatSink sink;
  bool raw = false;  // completions: the text is content as is
  bool parallel_tool_calls = true;
  StopStringFilter stops;
  std::unique_ptr<OutputParser> parser;
  bool ended_early = false;  // a stop string or a finished call ended it; the rest is dropped
  bool single_call_done = false;
  Clock::time_point first_token;
  bool got_token = false;
  std::vector<ChatEvent> early;  // events of the answer's opening written into the prompt
  const text::Tokenizer* tokenizer = nullptr;  // the tokens' texts of kLogprobs events
  // echo: the prompt's text, sent before the answer's; with log-probabilities, its first token
  // (whose entry, without one, comes first).
  std::string echo_text;
  bool echo_pending = false;
  int32_t first_prompt_token = -1;

  explicit RequestState(const std::vector<std::string>& stop_strings) : stops(stop_strings) {}

  void Emit(std::vector<ChatEvent> events, RequestId id) {
    for (ChatEvent& e : events) {
      if (single_call_done) return;
      sink(e);
      if (e.kind == ChatEvent::Kind::kToolCallEnd && !parallel_tool_calls) {
        // One call is all the client asked for: the answer ends with it.
        single_call_done = true;
        ended_early = true;
        engine->Cancel(id);
      }
    }
  }

  void Text(std::string_view text, RequestId id) {
    if (text.empty() || ended_early) return;
    if (raw) {
      ChatEvent e;
      e.kind = ChatEvent::Kind::kContent;
      e.text = std::string(text);
      sink(e);
      return;
    }
    Emit(parser->Feed(text), id);
  }

  // The echoed prompt's log-probabilities so far; the first token's entry (none) before them.
  void OnPromptLogprobs(const RequestEvent& e) {
    if (e.first_prompt_token == 1) SendFirstPromptEntry();
    for (const TokenLogprobs& lp : e.prompt_logprobs) sink(LogprobsEvent(lp));
  }

  void SendFirstPromptEntry() {
    if (first_prompt_token < 0) return;
    ChatEvent first;
    first.kind = ChatEvent::Kind::kLogprobs;
    first.logprobs.chosen = Text(TokenLogprob{first_prompt_token, 0.0f});
    first.logprobs.chosen.logprob = std::numeric_limits<float>::quiet_NaN();
    sink(first);
    first_prompt_token = -1;
  }

  // The echoed prompt, once, before the answer's first text (a prompt of one token gave no
  // kPromptLogprobs: its entry goes now).
  void Echo() {
    if (!echo_pending) return;
    echo_pending = false;
    SendFirstPromptEntry();
    ChatEvent e;
    e.kind = ChatEvent::Kind::kContent;
    e.text = std::move(echo_text);
    sink(e);
  }

  void OnToken(const RequestEvent& e) {
    Echo();
    if (!early.empty()) Emit(std::exchange(early, {}), e.id);
    if (!got_token) {
      got_token = true;
      first_token = Clock::now();
    }
    {  // counted as they come, so a live rate (the residency page's tokens/s) moves
      std::lock_guard<std::mutex> l(counters->mu);
      ++counters->metrics.generated_tokens_total;
    }
    if (ended_early) return;
    if (e.logprobs != nullptr) sink(LogprobsEvent(*e.logprobs));
    const std::string piece = stops.Push(e.text);
    Text(piece, e.id);
    if (stops.stopped() && !ended_early) {
      ended_early = true;
      engine->Cancel(e.id);
    }
  }

  TokenText Text(const TokenLogprob& t) const {
    const int32_t id = t.token;
    return {tokenizer->Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false),
            t.logprob};
  }

  ChatEvent LogprobsEvent(const TokenLogprobs& lp) const {
    ChatEvent e;
    e.kind = ChatEvent::Kind::kLogprobs;
    e.logprobs.chosen = Text(lp.chosen);
    for (const TokenLogprob& t : lp.top) e.logprobs.top.push_back(Text(t));
    return e;
  }

  FinishReason Reason(const RequestEvent& e) const {
    if (!e.status.ok()) return FinishReason::kError;
    const bool called = !raw && parser->tool_calls() > 0;
    if (single_call_done) return FinishReason::kToolCalls;
    if (stops.stopped()) return called ? FinishReason::kToolCalls : FinishReason::kStop;
    switch (e.reason) {
      case StopReason::kEos:
      case StopReason::kStopString:
        return called ? FinishReason::kToolCalls : FinishReason::kStop;
      case StopReason::kMaxTokens:
      case StopReason::kContextFull:
        return FinishReason::kLength;
      case StopReason::kCancelled:
        return FinishReason::kCancelled;
    }
    return FinishReason::kStop;
  }

  void OnFinished(const RequestEvent& e) {
    if (e.status.ok()) Echo();
    if (!early.empty() && e.status.ok()) Emit(std::exchange(early, {}), e.id);
    if (!ended_early) {
      std::string rest = stops.Push(e.text);
      if (!stops.stopped()) rest += stops.Flush();
      Text(rest, e.id);
    }
    if (!raw && !single_call_done) Emit(parser->Finish(), e.id);
    ChatEvent done;
    done.kind = ChatEvent::Kind::kFinished;
    done.finish_reason = Reason(e);
    if (stops.stopped() && done.finish_reason == FinishReason::kStop)
      done.stop_sequence = stops.matched();
    done.usage.prompt_tokens = e.usage.prompt_tokens;
    done.usage.cached_tokens = e.usage.cached_tokens;
    done.usage.completion_tokens = e.usage.generated_tokens;
    done.ttft_ms = e.timings.ttft_ms;
    if (!e.status.ok()) done.error = e.status.message();
    Count(e);
    sink(done);
  }

  void Count(const RequestEvent& e) {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> l(counters->mu);
    ServiceMetrics& m = counters->metrics;
    m.prompt_tokens_total += e.usage.prompt_tokens;
    m.cached_prompt_tokens_total += e.usage.cached_tokens;
    m.prompt_seconds_total += e.timings.ttft_ms / 1000.0;
    if (got_token)
      m.generation_seconds_total += std::chrono::duration<double>(now - first_token).count();
    --counters->in_flight;
    counters->ids.erase(e.id);
  }
};

RequestError Refusal(int http_status, std::string message, std::string param) {
  return RequestError{http_status, std::move(message), std::move(param)};
}

}  // namespace

struct ChatService::Impl {
  CausalLM& model;
  Engine& engine;
  const text::Tokenizer& tokenizer;
  const text::ChatTemplate* chat_template;
  ChatServiceOptions options;
  std::string model_name;
  std::vector<int32_t> stop_ids;
  std::vector<int32_t> forced_tokens;  // options.forced_output's tokens
  ToolCallFormat format = ToolCallFormat::kNone;
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  Impl(CausalLM& m, Engine& e, const text::Tokenizer& t, const text::ChatTemplate* c,
       ChatServiceOptions o)
      : model(m),
        engine(e),
        tokenizer(t),
        chat_template(c),
        options(o),
        forced_tokens(o.forced_output.empty() ? std::vector<int32_t>{}
                                              : t.Encode(o.forced_output, false)) {}

  uint64_t FreshSeed() {
    std::lock_guard<std::mutex> l(rng_mu);
    return rng();
  }

  Expected<Json> MessagesJson(const ChatRequest& r, RequestError* error) const;
  Json ToolsJson(const ChatRequest& r) const;
  Expected<RenderedPrompt> Render(const ChatRequest& r, RequestError* error) const;
  Expected<std::vector<int32_t>> PromptIds(const ChatRequest& r, RenderedPrompt* rendered,
                                           RequestError* error) const;
  Expected<RequestOptions> EngineRequest(const ChatRequest& r, std::vector<int32_t> ids,
                                         RequestError* error);
};

// The messages as the OpenAI-shaped JSON chat templates read (tool calls' arguments as objects).
Expected<Json> ChatService::Impl::MessagesJson(const ChatRequest& r, RequestError* error) const {
  Json messages = Json::array();
  for (size_t i = 0; i < r.messages.size(); ++i) {
    const ChatMessage& m = r.messages[i];
    Json j = {{"role", RoleName(m.role)}, {"content", m.content}};
    if (m.role == ChatMessage::Role::kAssistant && !m.reasoning_content.empty())
      j["reasoning_content"] = m.reasoning_content;
    if (!m.tool_calls.empty()) {
      Json calls = Json::array();
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& c = m.tool_calls[k];
        Json args = Json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded() || !args.is_object()) {
          const std::string param = "messages[" + std::to_string(i) + "].tool_calls[" +
                                    std::to_string(k) + "].function.arguments";
          *error = Refusal(400, param + " must be a JSON object in a string", param);
          return Status::Error(error->message);
        }
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    if (m.role == ChatMessage::Role::kTool) {
      j["tool_call_id"] = m.tool_call_id;
      if (!m.name.empty()) j["name"] = m.name;
    }
    messages.push_back(std::move(j));
  }
  return messages;
}

// The tools the template is given: none under tool_choice none, only the named one under a
// named tool_choice.
Json ChatService::Impl::ToolsJson(const ChatRequest& r) const {
  if (r.tools.empty() || r.tool_choice == ToolChoice::kNone) return nullptr;
  Json tools = Json::array();
  for (const ToolDefinition& t : r.tools) {
    if (r.tool_choice == ToolChoice::kNamed && t.name != r.tool_choice_name) continue;
    Json f = {{"name", t.name}};
    if (!t.description.empty()) f["description"] = t.description;
    f["parameters"] = t.parameters;
    tools.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return tools;
}

Expected<RenderedPrompt> ChatService::Impl::Render(const ChatRequest& r,
                                                   RequestError* error) const {
  RenderedPrompt out;
  if (r.raw_prompt) {
    out.text = r.prompt;
    out.add_special_tokens = true;
    return out;
  }
  auto refuse = [&](RequestError e) -> Status {
    *error = std::move(e);
    return Status::Error(error->message);
  };
  if (chat_template == nullptr)
    return refuse(Refusal(400,
                          "the model has no chat template, so messages cannot be rendered; send "
                          "a raw prompt to /v1/completions",
                          "messages"));
  if (r.messages.empty()) return refuse(Refusal(400, "messages must not be empty", "messages"));
  const bool want_tools = !r.tools.empty() && r.tool_choice != ToolChoice::kNone;
  if (want_tools && format == ToolCallFormat::kNone)
    return refuse(Refusal(400,
                          "the model's chat template renders no tool calls, so tools cannot be "
                          "offered; leave tools out or set tool_choice to \"none\"",
                          "tools"));
  const bool force_call =
      want_tools && (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed);
  text::ChatTemplateInputs in;
  MT_ASSIGN_OR_RETURN(in.messages, MessagesJson(r, error));
  if (force_call) {
    // The instruction goes into the system message (a new one at the front when there is none).
    if (!in.messages.empty() && in.messages[0]["role"] == "system") {
      in.messages[0]["content"] =
          in.messages[0]["content"].get<std::string>() + "\n\n" + CallInstruction(r);
    } else {
      in.messages.insert(in.messages.begin(),
                         Json{{"role", "system"}, {"content", CallInstruction(r)}});
    }
  }
  in.tools = ToolsJson(r);
  in.add_generation_prompt = true;
  in.extra = r.template_kwargs.is_object() ? r.template_kwargs : Json(nullptr);
  auto text = chat_template->Render(in);
  if (!text.ok()) return refuse(Refusal(400, text.message(), "messages"));
  out.text = std::move(text).value();
  out.starts_in_reasoning = EndsInsideThink(out.text);
  // A call written ahead inside an open <think> would skip the reasoning the template asked
  // for: there the instruction alone asks for the call.
  if (force_call && !out.starts_in_reasoning) out.answer_prefix = CallOpening(format, r);
  out.text += out.answer_prefix;
  return out;
}

Expected<std::vector<int32_t>> ChatService::Impl::PromptIds(const ChatRequest& r,
                                                            RenderedPrompt* rendered,
                                                            RequestError* error) const {
  const char* param = r.raw_prompt ? "prompt" : "messages";
  if (r.raw_prompt && !r.prompt_ids.empty()) {
    const int64_t vocab = model.config().vocab_size;
    for (int32_t id : r.prompt_ids)
      if (id < 0 || id >= vocab) {
        *error =
            Refusal(400,
                    "prompt: token id " + std::to_string(id) +
                        " is outside the model's vocabulary (0.." + std::to_string(vocab - 1) + ")",
                    "prompt");
        return Status::Error(error->message);
      }
    return r.prompt_ids;
  }
  MT_ASSIGN_OR_RETURN(*rendered, Render(r, error));
  // A template writes any BOS itself; adding special tokens again would double it.
  std::vector<int32_t> ids = tokenizer.Encode(rendered->text, rendered->add_special_tokens);
  if (ids.empty()) {
    *error = Refusal(400, std::string(param) + ": the prompt encodes to no tokens", param);
    return Status::Error(error->message);
  }
  return ids;
}

Expected<RequestOptions> ChatService::Impl::EngineRequest(const ChatRequest& r,
                                                          std::vector<int32_t> ids,
                                                          RequestError* error) {
  RequestOptions req;
  const SamplingParams& p = r.sampling;
  req.sampler.temperature = p.temperature;
  req.sampler.top_k = p.top_k;
  req.sampler.top_p = p.top_p;
  req.sampler.min_p = p.min_p;
  req.sampler.repetition_penalty = p.repetition_penalty;
  req.sampler.presence_penalty = p.presence_penalty;
  req.sampler.frequency_penalty = p.frequency_penalty;
  req.sampler.seed = p.seed ? *p.seed : FreshSeed();
  for (const auto& [id, bias] : p.logit_bias) req.sampler.logit_bias.push_back({id, bias});
  Status valid = ValidateSamplerOptions(req.sampler);
  if (valid.ok()) valid = ValidateLogitBias(req.sampler, model.config().vocab_size);
  if (!valid.ok()) {
    const bool bias = valid.message().starts_with("logit_bias");
    *error = Refusal(400, valid.message(), bias ? "logit_bias" : "");
    return valid;
  }
  const int64_t room = engine.sequence_limit() - static_cast<int64_t>(ids.size());
  req.max_new_tokens = p.max_tokens ? *p.max_tokens : room;
  req.prompt = std::move(ids);
  req.stop_ids = stop_ids;
  // Stop strings are applied by the service (it reports which one matched), not the engine.
  req.text = true;
  req.skip_special_tokens = true;
  req.forced_tokens = forced_tokens;
  req.top_logprobs = r.top_logprobs;
  req.prompt_logprobs = r.echo && r.top_logprobs >= 0;
  return req;
}

ChatService::ChatService(CausalLM& model, Engine& engine, const text::Tokenizer& tokenizer,
                         const text::ChatTemplate* chat_template, ChatServiceOptions options)
    : impl_(std::make_unique<Impl>(model, engine, tokenizer, chat_template, options)) {
  const std::filesystem::path config_path = model.config().source;
  const std::filesystem::path dir = config_path.parent_path();
  impl_->model_name = dir.filename().string();
  if (impl_->model_name.empty()) impl_->model_name = "moetier";
  // The loader has read generation_config.json already; should it fail here, config.json's EOS
  // ids still end generation.
  auto eos = ReadStopTokenIds(dir, model.config());
  impl_->stop_ids = StopIdsFor(eos.ok() ? *eos : model.config().eos_token_ids, tokenizer);
  if (chat_template != nullptr) impl_->format = DetectToolCallFormat(chat_template->source());
}

ChatService::~ChatService() {
  // Requests still running end at the engine's next step; their sinks hold what they use.
  std::set<RequestId> ids;
  {
    std::lock_guard<std::mutex> l(impl_->counters->mu);
    ids = impl_->counters->ids;
  }
  for (RequestId id : ids) impl_->engine.Cancel(id);
}

Expected<RequestId> ChatService::Start(const ChatRequest& request, ChatSink sink,
                                       RequestError* error) {
  RequestError local;
  if (error == nullptr) error = &local;
  RenderedPrompt rendered;
  MT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, impl_->PromptIds(request, &rendered, error));
  const int64_t limit = impl_->engine.sequence_limit();
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  const char* param = request.raw_prompt ? "prompt" : "messages";
  if (n_prompt >= limit) {
    *error = Refusal(400,
                     "the prompt has " + std::to_string(n_prompt) +
                         " tokens but the context holds " + std::to_string(limit) +
                         " positions, prompt and answer together (the server's --ctx-size / the "
                         "model's window); shorten the prompt",
                     param);
    return Status::Error(error->message);
  }
  MT_ASSIGN_OR_RETURN(RequestOptions req, impl_->EngineRequest(request, std::move(ids), error));

  auto state = std::make_shared<RequestState>(request.sampling.stop);
  state->engine = &impl_->engine;
  state->counters = impl_->counters;
  state->tokenizer = &impl_->tokenizer;
  if (request.raw_prompt && request.echo) {
    state->echo_pending = true;
    state->echo_text =
        request.prompt_ids.empty()
            ? request.prompt
            : impl_->tokenizer.Decode(request.prompt_ids, /*skip_special_tokens=*/false);
    if (request.top_logprobs >= 0) state->first_prompt_token = req.prompt.front();
  }
  // Every event carries the prompt's size (an API may report it before the answer ends, as
  // Anthropic's message_start does); kFinished carries the whole usage.
  state->sink = [sink = std::move(sink), n_prompt](const ChatEvent& e) {
    if (e.kind == ChatEvent::Kind::kFinished || e.usage.prompt_tokens == n_prompt) return sink(e);
    ChatEvent with_usage = e;
    with_usage.usage.prompt_tokens = n_prompt;
    sink(with_usage);
  };
  state->raw = request.raw_prompt;
  state->parallel_tool_calls = request.parallel_tool_calls;
  if (!request.raw_prompt) {
    OutputParserOptions po;
    po.format = impl_->format;
    po.tools_enabled = !request.tools.empty() && request.tool_choice != ToolChoice::kNone;
    po.starts_in_reasoning = rendered.starts_in_reasoning;
    state->parser = MakeOutputParser(po, impl_->FreshSeed());
  }
  // The parser sees the call opening written into the prompt, as if the model had written it;
  // what that gives is sent with the first token.
  if (!rendered.answer_prefix.empty()) state->early = state->parser->Feed(rendered.answer_prefix);
  // Under the counters' lock, so that the queue check, the count and the id stay together (the
  // engine thread takes it only to count a finished request, never while holding the engine's).
  Counters& c = *impl_->counters;
  std::lock_guard<std::mutex> l(c.mu);
  const int64_t waiting = c.in_flight - impl_->engine.options().max_running;
  if (waiting >= impl_->options.max_waiting) {
    *error = Refusal(503,
                     "the server is busy: " + std::to_string(std::max<int64_t>(waiting, 0)) +
                         " requests are waiting already; retry later",
                     "");
    return Status::Error(error->message);
  }
  ++c.in_flight;
  ++c.metrics.requests_total;
  const RequestId id = impl_->engine.Submit(std::move(req), [state](const RequestEvent& e) {
    switch (e.kind) {
      case RequestEvent::Kind::kToken:
        return state->OnToken(e);
      case RequestEvent::Kind::kPromptLogprobs:
        return state->OnPromptLogprobs(e);
      case RequestEvent::Kind::kFinished:
        return state->OnFinished(e);
    }
  });
  c.ids.insert(id);
  return id;
}

void ChatService::Cancel(RequestId id) {
  impl_->engine.Cancel(id);
}

Expected<int64_t> ChatService::CountPromptTokens(const ChatRequest& request) {
  RequestError error;
  RenderedPrompt rendered;
  MT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, impl_->PromptIds(request, &rendered, &error));
  return static_cast<int64_t>(ids.size());
}

ServiceMetrics ChatService::Metrics() const {
  ServiceMetrics m;
  int64_t in_flight = 0;
  {
    std::lock_guard<std::mutex> l(impl_->counters->mu);
    m = impl_->counters->metrics;
    in_flight = impl_->counters->in_flight;
  }
  // The engine runs up to max_running sequences; the rest wait in its queue.
  const int64_t max_running = impl_->engine.options().max_running;
  m.requests_running = std::min(in_flight, max_running);
  m.requests_waiting = std::max<int64_t>(0, in_flight - max_running);
  const EngineStats stats = impl_->engine.stats();
  m.kv_blocks_used = stats.kv_blocks_used;
  m.kv_blocks_total = stats.kv_blocks_total;
  m.kv_blocks_touched = stats.kv_blocks_touched;
  m.kv_host_blocks_held = stats.kv_host_blocks_held;
  m.kv_host_blocks_total = stats.kv_host_blocks_total;
  m.kv_host_restored_tokens = stats.kv_host_restored_tokens;
  return m;
}

const std::string& ChatService::model_name() const {
  return impl_->model_name;
}

const CausalLM& ChatService::model() const {
  return impl_->model;
}

}  // namespace moetier::server
