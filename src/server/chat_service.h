// ChatService: the one place where an API request meets the engine. It renders the
// conversation with the model's chat template (tools and template variables included), counts
// and checks the prompt against the context, submits it to the engine (engine/engine.h), and
// turns the engine's token events into ChatEvents: the stop strings applied (a possible stop's
// beginning held back), the text split by the output parser (output_parser.h) into content,
// reasoning and tool calls, and a last kFinished with the finish reason and usage.
//
// Thread-safety: Start, Cancel, CountPromptTokens and Metrics may be called from any thread
// (the HTTP handlers'); sinks run on the engine's thread and must return quickly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "model/causal_lm.h"
#include "server/chat_types.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::server {

using ChatSink = std::function<void(const ChatEvent&)>;

// Why Start refused a request: the HTTP status it maps to, and the message naming the field.
struct RequestError {
  int http_status = 400;  // 400 bad request, 413 too large, 503 queue full
  std::string message;
  std::string param;  // the request field at fault, when one is
};

struct ChatServiceOptions {
  int64_t max_waiting = 64;  // requests queued beyond the running ones before 503
  // A test hook (`moetier serve` reads it from MOETIER_TEST_FORCED_OUTPUT): every answer begins
  // with this text's tokens instead of sampled ones, so client tests can see a random model
  // "write" a tool call or reasoning and check what the APIs make of it. Empty: off.
  std::string forced_output;
};

// Counters for GET /metrics (monotonic unless said otherwise).
struct ServiceMetrics {
  int64_t requests_running = 0;  // gauges
  int64_t requests_waiting = 0;
  int64_t requests_total = 0;
  int64_t prompt_tokens_total = 0;
  int64_t cached_prompt_tokens_total = 0;
  int64_t generated_tokens_total = 0;
  double prompt_seconds_total = 0;  // time to first token, summed
  double generation_seconds_total = 0;
  int64_t kv_blocks_used = 0;  // gauges
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_touched = 0;
  int64_t kv_host_blocks_held = 0;  // the host KV tier (--kv-host-gb)
  int64_t kv_host_blocks_total = 0;
  int64_t kv_host_restored_tokens = 0;  // a counter
};

class ChatService {
 public:
  // The model, its engine (driven by the engine's own thread: Engine::Start), tokenizer and
  // chat template must outlive the service.
  ChatService(CausalLM& model, Engine& engine, const text::Tokenizer& tokenizer,
              const text::ChatTemplate* chat_template, ChatServiceOptions options = {});
  ~ChatService();

  // Submits the request; its events go to `sink` (the last is kFinished). A request that cannot
  // run (a template error, a prompt longer than the context, tools without a template that
  // renders them, a full queue) is refused here, before anything is queued.
  Expected<RequestId> Start(const ChatRequest& request, ChatSink sink, RequestError* error);
  // The request ends with kFinished (kCancelled) at the engine's next step (a client gone).
  void Cancel(RequestId id);
  // The prompt's tokens as Start would submit them (count_tokens).
  Expected<int64_t> CountPromptTokens(const ChatRequest& request);
  ServiceMetrics Metrics() const;
  // The model's name for /v1/models (its directory's name).
  const std::string& model_name() const;
  // The model served (its residency and expert statistics for /v1/residency).
  const CausalLM& model() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moetier::server
