// The engine: many requests served together by one model (continuous batching).
//
// Any thread submits a request (prompt ids, sampling, stops, limits) with a sink for its
// events, and may cancel it. One thread at a time drives the model — RunUntilIdle() on the
// caller's thread (the CLI commands), or Start() for a thread of the engine's own (a server).
// Each step runs, in one Forward over a ragged batch:
//   - the next token of every running sequence that is decoding (latency first),
//   - then chunks of the prompts being prefilled, oldest first, up to max_batch_tokens in all
//     (a long prompt is cut into chunks, so it does not stall the others' decoding),
//   - then, while fewer than max_running sequences run and KV blocks are available, the next
//     waiting requests (whose prompts may start from blocks the prefix cache holds).
// KV blocks come from one pool (backend/kv_cache.h) through KvBlocks (engine/kv_blocks.h). When
// a sequence needs a block and none is left, the most recently admitted other sequence is
// preempted: its blocks are released and it waits to be recomputed from its tokens (the same
// K/V bit for bit, so its output does not change). A request that alone cannot fit the pool is
// refused with an error; the others go on.
//
// Events reach each request's sink on the driving thread, in order: kPromptLogprobs when asked,
// a kToken per generated token (with the text it completes, for text requests), then one
// kFinished. A sink must return
// quickly (it runs inside the step) and may call Cancel.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/kv_cache.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/host_kv_tier.h"
#include "engine/kv_blocks.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "engine/stop_reason.h"
#include "model/causal_lm.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier {

using RequestId = int64_t;

struct RequestOptions {
  std::vector<int32_t> prompt;  // token ids (at least one)
  SamplerOptions sampler;
  int64_t max_new_tokens = 256;
  std::vector<int32_t> stop_ids;          // generation ends after emitting one of these
  std::vector<std::string> stop_strings;  // text requests: generation ends before one of these
  bool text = false;  // decode the tokens to text (needs the engine's tokenizer)
  bool skip_special_tokens = true;
  // The request joins once the engine has run this many steps (`batch`'s "after": joins in
  // mid-flight, reproducibly); 0 joins at once.
  int64_t arrival_step = 0;
  // -1: none; 0..kMaxTopLogprobs: each generated token's log-probability and this many of the
  // most likely tokens' (engine/logprobs.h). Such a request's rows are read whole, never drawn
  // on the device.
  int top_logprobs = -1;
  // With top_logprobs >= 0: also the log-probability of every prompt token from the second on,
  // given the tokens before it (kPromptLogprobs events, before the first kToken). Such a prompt
  // is computed whole: it takes no blocks from the prefix cache.
  bool prompt_logprobs = false;
  int64_t first_prompt_logprob = 1;  // prompt_logprobs from this prompt token on (at least 1)
  // Emitted in place of the first sampled tokens (the forward still runs): a test hook, so a
  // server test can make a random model "say" a tool call (MOETIER_TEST_FORCED_OUTPUT).
  std::vector<int32_t> forced_tokens;
};

struct RequestUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
  int64_t generated_tokens = 0;
};

struct RequestTimings {
  double queue_ms = 0;             // arrival to admission
  double ttft_ms = 0;              // arrival to the first generated token
  double decode_tokens_per_s = 0;  // after the first token (0 with fewer than two)
};

struct RequestEvent {
  enum class Kind { kToken, kPromptLogprobs, kFinished };
  Kind kind = Kind::kToken;
  RequestId id = 0;
  int32_t token = -1;     // kToken
  std::string_view text;  // text requests: the text final with this event (may be empty)
  const TokenLogprobs* logprobs = nullptr;  // kToken, when the request asked for them
  // kPromptLogprobs: the prompt tokens' from index first_prompt_token on, in order; every token
  // from the second is given once over the events.
  std::span<const TokenLogprobs> prompt_logprobs;
  int64_t first_prompt_token = 0;
  // kFinished: why, or the error that ended this request (the others go on).
  StopReason reason = StopReason::kMaxTokens;
  Status status;
  RequestUsage usage;
  RequestTimings timings;
};
using EventSink = std::function<void(const RequestEvent&)>;

struct EngineOptions {
  int max_running = 4;             // --parallel: sequences running at once
  int64_t max_batch_tokens = 512;  // --max-batch-tokens: tokens per step, all sequences
  int64_t kv_positions = 8192;     // the pool, over all sequences (--ctx-size)
  DType kv_dtype = DType::kF32;    // --kv-dtype
  int64_t block_size = KvPool::kDefaultBlockSize;
  // One sequence's most positions (0: the model's max_position_embeddings, capped by the pool).
  int64_t max_sequence_positions = 0;
  bool prefix_cache = true;
  // --kv-host-gb: host RAM for prefix-cache blocks the pool evicts (host_kv_tier.h); 0: none.
  uint64_t kv_host_bytes = 0;
  // Whether a model whose candidates come from its device (a GPU) draws the tokens of samplers
  // without top-k or penalties there (Sampler::DrawsOnDevice); unset: MOETIER_DEVICE_DRAWS.
  std::optional<bool> device_draws;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t kv_blocks_used = 0;  // held by sequences (blocks the prefix cache keeps idle are free)
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_touched = 0;  // ever used: on the CPU, the pool's RAM grows until all are
  // The host KV tier: blocks it holds and can hold, and the prompt tokens it gave back instead
  // of their recomputation (counted in prefix_hit_tokens too).
  int64_t kv_host_blocks_held = 0;
  int64_t kv_host_blocks_total = 0;
  int64_t kv_host_restored_tokens = 0;
};

class Engine {
 public:
  // `tokenizer` may be null when no request asks for text.
  static Expected<std::unique_ptr<Engine>> Create(CausalLM& model, const text::Tokenizer* tokenizer,
                                                  const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Problems with the request itself (an empty prompt, a prompt the pool cannot
  // hold, text without a tokenizer) arrive as its kFinished event with an error.
  RequestId Submit(RequestOptions request, EventSink sink);
  // Thread-safe; the request finishes with reason kCancelled at the next step.
  void Cancel(RequestId id);

  // Drives the model on this thread until every request submitted so far has finished.
  void RunUntilIdle();
  // A thread of the engine's own drives it until Stop() (or destruction).
  void Start();
  void Stop();

  const EngineOptions& options() const { return options_; }
  int64_t sequence_limit() const { return max_sequence_positions_; }
  const KvPool& kv_pool() const { return pool_; }
  // Thread-safe: the figures as of the end of the last step.
  EngineStats stats() const;

 private:
  struct Sequence;
  Engine(CausalLM& model, const text::Tokenizer* tokenizer, const EngineOptions& options,
         KvPool pool);

  bool DrainInbox();  // moves submitted and cancelled requests in; false when idle for good
  bool HasWork() const;
  Status Step();
  void EndFailedStep(const Status& error);
  void Admit(std::unique_ptr<Sequence> seq);
  bool Schedule();
  // Continues a prefix match of `s` past its first `matched` blocks from the host KV tier,
  // copying each block found there into a fresh pool block; returns how many it added.
  int64_t RestoreFromHost(Sequence& s, int64_t matched, int64_t max_blocks);
  // How many of s's pending tokens this step runs, within `budget`: a prompt whose
  // log-probabilities are asked for also within the step's kMaxPromptLogprobRows.
  int64_t ChunkOf(Sequence& s, int64_t budget);
  bool TakeTokens(Sequence& s, int64_t n, bool& preempted_self);
  bool EnsureBlocks(Sequence& s, int64_t n_positions);
  bool MakeWritable(Sequence& s, int64_t position);
  bool PreemptOneBesides(const Sequence& s);
  void Preempt(Sequence& s);
  // Per logit row, whether its token is drawn on the model's device (Sampler::DrawsOnDevice,
  // where the model selects candidates there), into draws_.
  void ChooseDeviceDraws();
  // Whether s's next token is one of its request's forced tokens, not drawn.
  static bool Forced(const Sequence& s);
  // What the step hands back of its logit rows: each row's arg-max when every draw is one
  // (greedy without penalties, or forced: CausalLM::ForwardArgMax); each row's top-k candidates
  // or device-drawn token (ForwardTopK) when some row is drawn on the device, or when every
  // draw reads at most kMaxCandidateTopK candidates and the model selects them on its device
  // (rows that read more then read their row); else the rows. A row drawn on the device is so
  // in every step, whatever else the batch holds, asking for log-probabilities or not. A row
  // whose request asks for them never gets the arg-max alone: its candidates with its
  // log-sum-exp (Batch::scored), or (a row drawn on the device that asks for alternatives) its
  // row.
  enum class StepDraw { kArgMax, kTopK, kLogits };
  StepDraw ChooseStepDraw() const;
  // Batch::scored for a step ending in candidates where some row's request asks for
  // log-probabilities (else empty): a prompt row's token, -1 for a row that draws one.
  std::span<const int32_t> ScoredTokens(StepDraw draw);
  // After the step: sampled_ from the model's arg-max ids, or drawn from top_k_ or logits_.
  void AfterForward(StepDraw draw);
  // Every logit row's next token: drawn on the device, or drawn from its candidates, or (a row
  // whose candidates did not fit, or whose draw reads more) from its row, read from the model;
  // on this thread: a few dozen candidates a row.
  void SampleCandidateRows();
  // Draws the next token of every logit row's sequence into sampled_ / sample_status_, rows of
  // different sequences at once on sample_pool_ (each sequence has its own sampler, so a draw does
  // not depend on the thread that made it).
  void SampleRows(const std::vector<float>& logits);
  // The log-probabilities of each row's token whose request asked for them, into row_logprobs_
  // (from logits_, or under kTopK from the candidates and sums, else the row read from the
  // model).
  void RowLogprobs(StepDraw draw);
  static bool WantsLogprobs(const Sequence& s);
  // Whether logit row r gives a prompt token's log-probability (not the next token's draw).
  bool IsPromptRow(size_t r) const { return row_prompt_token_[r] >= 0; }
  // The kPromptLogprobs events of the step's prompt rows, a run of rows per sequence.
  void EmitPromptLogprobs();
  void RegisterFullBlocks(Sequence& s);
  void OnToken(Sequence& s, int32_t token, const TokenLogprobs* logprobs);
  void Finish(Sequence& s, StopReason reason, Status status = OkStatus());
  void ReleaseBlocks(Sequence& s);
  void RemoveFinished();
  void Loop();
  void PublishStats();  // copies stats_ for stats() on other threads

  CausalLM& model_;
  const text::Tokenizer* tokenizer_;
  EngineOptions options_;
  int64_t max_sequence_positions_ = 0;
  KvPool pool_;
  KvBlocks blocks_;
  std::unique_ptr<HostKvTier> host_tier_;  // with --kv-host-gb

  // Submitted, not yet taken by the driving thread.
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<RequestId> cancels_;
  RequestId next_id_ = 1;

  // Owned by the driving thread.
  std::vector<std::unique_ptr<Sequence>> future_;   // arrival_step not reached yet
  std::deque<std::unique_ptr<Sequence>> waiting_;   // arrived, not admitted (preempted first)
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::vector<Sequence*> in_batch_;                 // per batch sequence index
  std::vector<int32_t> tokens_, positions_, seq_of_, logit_rows_;
  std::vector<Sequence*> logit_seq_;  // per logit row
  // Per logit row: the prompt token whose log-probability it gives (a request's
  // prompt_logprobs: the row of the position before it), or -1 for a row that draws a token.
  std::vector<int64_t> row_prompt_token_;
  std::vector<int32_t> scored_;  // the step's Batch::scored
  // Prompt rows a step reads whole, at most: each is a vocabulary of floats (0.6 MB for
  // 151,936 tokens), on the host and on a GPU, whatever --max-batch-tokens allows.
  static constexpr int64_t kMaxPromptLogprobRows = 256;
  int64_t prompt_rows_left_ = kMaxPromptLogprobRows;  // this step's, while it is scheduled
  std::vector<std::span<const int32_t>> tables_;      // per batch sequence
  std::vector<float> logits_;
  TopKRows top_k_;                 // the step's candidates (StepDraw::kTopK)
  std::vector<RowDraw> draws_;     // per logit row (Batch::draws); empty: none on the device
  std::vector<float> row_logits_;  // a row that did not fit its candidates
  std::vector<TokenLogprobs> row_logprobs_;  // per logit row, when its request asked
  // The sampling threads (none for one sequence at a time) and each logit row's draw. A draw over
  // a real vocabulary takes ~1 ms: 16 sequences one after another would outlast a GPU's step.
  std::unique_ptr<ThreadPool> sample_pool_;
  std::vector<SamplerScratch> sample_scratch_;  // one per sampling thread
  std::vector<int32_t> sampled_;  // per logit row: its token (the arg-max ids, when the step asked)
  std::vector<Status> sample_status_;
  EngineStats stats_;
  mutable std::mutex stats_mu_;
  EngineStats published_stats_;  // under stats_mu_

  std::thread thread_;
  bool stop_ = false;  // under inbox_mu_
};

}  // namespace moetier
