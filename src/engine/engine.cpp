#include "engine/engine.h"

#include <algorithm>
#include <optional>

#include "core/log.h"
#include "core/tuning.h"
#include "engine/stop_strings.h"

namespace moetier {

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

// One request on its way through the engine.
struct Engine::Sequence {
  RequestId id = 0;
  RequestOptions req;
  EventSink sink;
  Status submit_error;  // a problem found at Submit, reported when it arrives

  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  int64_t n_computed = 0;           // leading positions whose K/V the blocks hold
  int64_t step_tokens = 0;          // positions this step computes
  std::vector<int32_t> blocks;      // block table
  std::vector<uint64_t> hashes;     // chain hash of each leading registered/matched block
  int64_t cached_tokens = -1;       // prompt tokens from the prefix cache at first admission
  int64_t next_prompt_logprob = 1;  // prompt_logprobs: the first prompt token not yet given
  bool requeue = false;             // preempted this step: back to the front of waiting
  bool in_batch = false;
  bool finished = false;
  bool cancelled = false;

  std::optional<Sampler> sampler;
  std::optional<text::StreamDecoder> decoder;
  std::optional<StopStringFilter> stops;
  std::string piece;  // the text of the current event

  Clock::time_point arrived, admitted, first_token, last_token;

  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
};

Expected<std::unique_ptr<Engine>> Engine::Create(CausalLM& model, const text::Tokenizer* tokenizer,
                                                 const EngineOptions& options) {
  if (options.max_running <= 0) return Status::Error("--parallel must be at least 1");
  if (options.max_batch_tokens <= 0) return Status::Error("--max-batch-tokens must be at least 1");
  const int64_t B = options.block_size;
  const int64_t n_blocks = (options.kv_positions + B - 1) / B;
  MT_ASSIGN_OR_RETURN(KvPool pool, model.NewKvPool(n_blocks, B, options.kv_dtype));
  return std::unique_ptr<Engine>(new Engine(model, tokenizer, options, std::move(pool)));
}

Engine::Engine(CausalLM& model, const text::Tokenizer* tokenizer, const EngineOptions& options,
               KvPool pool)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      pool_(std::move(pool)),
      blocks_(pool_.n_blocks(), pool_.block_size()) {
  // Unpinned: the compute threads own the cores while a forward runs; these only run between.
  const int sample_threads = std::min(options.max_running, ThreadPool::DefaultThreads());
  if (sample_threads > 1) sample_pool_ = std::make_unique<ThreadPool>(sample_threads, false);
  sample_scratch_.resize(static_cast<size_t>(std::max(sample_threads, 1)));
  // The pool rounds up to whole blocks; a sequence gets exactly the positions asked for.
  const int64_t pool_positions =
      std::min(options.kv_positions, pool_.n_blocks() * pool_.block_size());
  const int64_t model_max = model.config().max_position_embeddings;
  max_sequence_positions_ = options.max_sequence_positions > 0 ? options.max_sequence_positions
                            : model_max > 0                    ? model_max
                                                               : pool_positions;
  max_sequence_positions_ = std::min(max_sequence_positions_, pool_positions);
  const auto host_slots = static_cast<int64_t>(options.kv_host_bytes / pool_.block_bytes());
  if (options.prefix_cache && host_slots > 0)
    host_tier_ = HostKvTier::Create(host_slots, pool_.block_size(), pool_.block_bytes());
  if (options.prefix_cache && host_slots > 0 && host_tier_ == nullptr)
    LogWarn("kv host tier: " + std::to_string(options.kv_host_bytes >> 20) +
            " MiB could not be reserved; running without it (lower --kv-host-gb)");
  if (host_tier_ != nullptr) {
    blocks_.SetEvictionSink([this](int32_t block, uint64_t parent, uint64_t hash,
                                   std::span<const int32_t> block_tokens) {
      host_tier_->Keep(pool_, block, parent, hash, block_tokens);
    });
  }
  PublishStats();
}

Engine::~Engine() {
  Stop();
}

RequestId Engine::Submit(RequestOptions request, EventSink sink) {
  auto s = std::make_unique<Sequence>();
  if (request.prompt.empty()) s->submit_error = Status::Error("the prompt is empty");
  if (request.text && tokenizer_ == nullptr)
    s->submit_error = Status::Error("a text request needs the model's tokenizer");
  if (request.top_logprobs > kMaxTopLogprobs)
    s->submit_error = Status::Error("top_logprobs: at most " + std::to_string(kMaxTopLogprobs));
  if (request.prompt_logprobs && request.top_logprobs < 0)
    s->submit_error = Status::Error("prompt_logprobs needs top_logprobs >= 0");
  if (request.first_prompt_logprob < 1)
    s->submit_error = Status::Error("first_prompt_logprob: at least 1 (the first token has none)");
  s->req = std::move(request);
  s->sink = std::move(sink);
  std::lock_guard<std::mutex> l(inbox_mu_);
  s->id = next_id_++;
  const RequestId id = s->id;
  inbox_.push_back(std::move(s));
  inbox_cv_.notify_all();
  return id;
}

void Engine::Cancel(RequestId id) {
  std::lock_guard<std::mutex> l(inbox_mu_);
  cancels_.push_back(id);
  inbox_cv_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> l(stats_mu_);
  return published_stats_;
}

void Engine::PublishStats() {
  stats_.kv_blocks_total = blocks_.n_blocks();
  stats_.kv_blocks_used = blocks_.n_blocks() - blocks_.n_available();
  stats_.kv_blocks_touched = blocks_.n_touched();
  if (host_tier_ != nullptr) {
    stats_.kv_host_blocks_held = host_tier_->n_held();
    stats_.kv_host_blocks_total = host_tier_->n_slots();
  }
  std::lock_guard<std::mutex> l(stats_mu_);
  published_stats_ = stats_;
}

bool Engine::HasWork() const {
  return !future_.empty() || !waiting_.empty() || !running_.empty();
}

// Takes what other threads submitted and cancelled, and moves arrivals whose step has come to
// the waiting queue. With nothing else to do, time jumps to the next arrival.
bool Engine::DrainInbox() {
  std::vector<std::unique_ptr<Sequence>> in;
  std::vector<RequestId> cancels;
  {
    std::lock_guard<std::mutex> l(inbox_mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& s : in) future_.push_back(std::move(s));
  for (RequestId id : cancels) {
    auto mark = [&](auto& list) {
      for (auto& s : list)
        if (s->id == id) s->cancelled = true;
    };
    mark(future_);
    mark(waiting_);
    mark(running_);
  }
  if (waiting_.empty() && running_.empty() && !future_.empty()) {
    int64_t next = future_.front()->req.arrival_step;
    for (auto& s : future_) next = std::min(next, s->req.arrival_step);
    stats_.steps = std::max(stats_.steps, next);
  }
  for (size_t i = 0; i < future_.size();) {
    if (future_[i]->req.arrival_step <= stats_.steps) {
      future_[i]->arrived = Clock::now();
      waiting_.push_back(std::move(future_[i]));
      future_.erase(future_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return HasWork();
}

void Engine::RunUntilIdle() {
  while (DrainInbox()) {
    const Status s = Step();
    (void)s;  // a failed step has finished its sequences with the error
    PublishStats();
  }
}

void Engine::Start() {
  {
    std::lock_guard<std::mutex> l(inbox_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> l(inbox_mu_);
    stop_ = true;
    inbox_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Engine::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(inbox_mu_);
      inbox_cv_.wait(l, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || HasWork(); });
      if (stop_) return;
    }
    if (DrainInbox()) {
      const Status s = Step();
      (void)s;
      PublishStats();
    }
  }
}

// ---- one step ------------------------------------------------------------------------------

Status Engine::Step() {
  // Cancelled requests end before the step, wherever they are.
  for (auto* list : {&running_}) {
    for (auto& s : *list)
      if (s->cancelled && !s->finished) Finish(*s, StopReason::kCancelled);
  }
  for (auto& s : waiting_)
    if (s->cancelled && !s->finished) Finish(*s, StopReason::kCancelled);
  for (auto& s : future_)
    if (s->cancelled && !s->finished) Finish(*s, StopReason::kCancelled);
  RemoveFinished();

  if (!Schedule()) {
    ++stats_.steps;
    return OkStatus();
  }
  Batch batch;
  batch.tokens = tokens_;
  batch.positions = positions_;
  batch.seq_of = seq_of_;
  batch.block_tables = tables_;
  batch.logit_rows = logit_rows_;
  ChooseDeviceDraws();
  batch.draws = draws_;
  const StepDraw draw = ChooseStepDraw();
  batch.scored = ScoredTokens(draw);
  const Status s = draw == StepDraw::kArgMax ? model_.ForwardArgMax(batch, pool_, sampled_)
                   : draw == StepDraw::kTopK ? model_.ForwardTopK(batch, pool_, top_k_)
                                             : model_.Forward(batch, pool_, logits_);
  ++stats_.steps;
  if (!s.ok()) {
    EndFailedStep(s);
    return s;
  }
  AfterForward(draw);
  RemoveFinished();
  return OkStatus();
}

// The step's K/V are undefined for every sequence in it. A non-finite value ends only the
// sequence whose token held it (CausalLM::NonFiniteSequence): the others keep their tokens
// pending and run the step again. Any other error ends them all.
void Engine::EndFailedStep(const Status& error) {
  const int32_t culprit = model_.NonFiniteSequence();
  if (culprit >= 0 && static_cast<size_t>(culprit) < in_batch_.size()) {
    Finish(*in_batch_[static_cast<size_t>(culprit)], StopReason::kCancelled, error);
  } else {
    for (Sequence* seq : in_batch_) Finish(*seq, StopReason::kCancelled, error);
  }
  RemoveFinished();
}

// Fills the batch: decoding sequences first, then prompt chunks, then admissions, within
// max_batch_tokens. False when there is nothing to run.
bool Engine::Schedule() {
  tokens_.clear();
  positions_.clear();
  seq_of_.clear();
  logit_rows_.clear();
  logit_seq_.clear();
  row_prompt_token_.clear();
  tables_.clear();
  in_batch_.clear();
  for (auto& s : running_) s->in_batch = false;
  int64_t budget = options_.max_batch_tokens;
  prompt_rows_left_ = kMaxPromptLogprobRows;
  // Two walks over the running sequences, in admission order: decode steps, then prefills.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence& s = *running_[i];
      if (s.finished || s.requeue || s.in_batch) continue;
      const bool decoding = s.pending() == 1 && s.n_generated > 0;
      if ((pass == 0) != decoding) continue;
      bool preempted_self = false;
      const int64_t n = ChunkOf(s, budget);
      if (n > 0 && TakeTokens(s, n, preempted_self)) budget -= n;
    }
  }
  // Admissions, while there is room in the step, in the running set and in the pool.
  while (budget > 0 && static_cast<int>(running_.size()) < options_.max_running &&
         !waiting_.empty()) {
    Sequence& next = *waiting_.front();
    if (next.finished) {
      waiting_.pop_front();
      continue;
    }
    const int64_t B = pool_.block_size();
    const int64_t need =
        (static_cast<int64_t>(next.tokens.empty() ? next.req.prompt.size() : next.tokens.size()) +
         B) /
        B;
    // A request too long for the whole pool is refused (in Admit); others wait for room.
    if (next.submit_error.ok() && need <= pool_.n_blocks() && blocks_.n_available() < need &&
        !running_.empty())
      break;
    std::unique_ptr<Sequence> seq = std::move(waiting_.front());
    waiting_.pop_front();
    Sequence* s = seq.get();
    Admit(std::move(seq));
    if (s->finished) continue;
    bool preempted_self = false;
    const int64_t n = ChunkOf(*s, budget);
    if (n > 0 && TakeTokens(*s, n, preempted_self)) budget -= n;
  }
  // Preempted sequences go back to the front of the queue, oldest first.
  for (size_t i = running_.size(); i-- > 0;) {
    if (!running_[i]->requeue) continue;
    running_[i]->requeue = false;
    waiting_.push_front(std::move(running_[i]));
    running_.erase(running_.begin() + static_cast<ptrdiff_t>(i));
  }
  return !tokens_.empty();
}

// Makes `seq` running: validates it, reuses the longest cached prefix of its tokens.
void Engine::Admit(std::unique_ptr<Sequence> seq) {
  Sequence& s = *seq;
  running_.push_back(std::move(seq));
  if (!s.submit_error.ok()) return Finish(s, StopReason::kCancelled, s.submit_error);
  if (s.tokens.empty()) {  // first admission (a preempted sequence keeps its tokens)
    s.tokens = s.req.prompt;
    s.n_prompt = static_cast<int64_t>(s.tokens.size());
    s.next_prompt_logprob = s.req.first_prompt_logprob;
    // Room for every token, block and hash the sequence can reach, so decode steps allocate
    // nothing (a preempted sequence keeps them).
    // (max_new_tokens may be anything up to INT64_MAX: capped by the sequence limit first.)
    const size_t most =
        static_cast<size_t>(s.n_prompt + std::min(s.req.max_new_tokens, max_sequence_positions_));
    s.tokens.reserve(most);
    s.blocks.reserve(most / static_cast<size_t>(pool_.block_size()) + 2);
    s.hashes.reserve(most / static_cast<size_t>(pool_.block_size()) + 2);
    Status valid = ValidateSamplerOptions(s.req.sampler);
    if (valid.ok()) valid = ValidateLogitBias(s.req.sampler, model_.config().vocab_size);
    if (!valid.ok()) return Finish(s, StopReason::kCancelled, valid);
    if (s.req.max_new_tokens <= 0) return Finish(s, StopReason::kMaxTokens);
    s.sampler.emplace(s.req.sampler);
    if (s.req.text) {
      s.decoder.emplace(*tokenizer_, s.req.skip_special_tokens);
      s.stops.emplace(s.req.stop_strings);
    }
  }
  const int64_t B = pool_.block_size();
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  if (n >= max_sequence_positions_ + (s.n_generated > 0 ? 1 : 0) ||
      (n + B) / B > pool_.n_blocks()) {
    const int64_t limit = std::min(max_sequence_positions_, pool_.n_blocks() * B);
    return Finish(s, StopReason::kContextFull,
                  Status::Error("the prompt has " + std::to_string(n) +
                                " tokens but a sequence may hold " + std::to_string(limit) +
                                " positions (the model's window and the KV cache); raise "
                                "--ctx-size / --kv-cache-gb or shorten the prompt"));
  }
  s.admitted = Clock::now();
  // The prefix cache: whole blocks, and at least the last token left to run for its logits.
  if (options_.prefix_cache) {
    int64_t max_blocks = (n - 1 + B - 1) / B;
    // Prompt log-probabilities: the rows before the next token to give are computed here.
    if (s.req.prompt_logprobs) max_blocks = std::min(max_blocks, (s.next_prompt_logprob - 1) / B);
    int64_t matched = blocks_.Match(s.tokens, max_blocks, s.blocks, s.hashes);
    if (host_tier_ != nullptr) matched += RestoreFromHost(s, matched, max_blocks);
    s.n_computed = std::min(matched * B, n - 1);
  }
  if (s.cached_tokens < 0) {
    s.cached_tokens = std::min(s.n_computed, s.n_prompt);
    stats_.prefix_hit_tokens += s.cached_tokens;
  }
}

int64_t Engine::RestoreFromHost(Sequence& s, int64_t matched, int64_t max_blocks) {
  const int64_t B = pool_.block_size();
  const int64_t whole = std::min<int64_t>(max_blocks, static_cast<int64_t>(s.tokens.size()) / B);
  uint64_t parent = matched > 0 ? s.hashes[static_cast<size_t>(matched - 1)] : 0;
  int64_t k = matched;
  for (; k < whole; ++k) {
    const auto block_tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(k * B),
                                                                         static_cast<size_t>(B));
    // The slot is reserved first: the pool block's allocation may evict into the tier.
    const int32_t slot = host_tier_->Take(parent, block_tokens);
    if (slot < 0) break;
    const int32_t b = blocks_.Allocate();
    const bool copied = b >= 0 && host_tier_->CopyInto(slot, pool_, b);
    host_tier_->Release(slot);
    if (!copied) {
      if (b >= 0) blocks_.Unref(b);
      break;
    }
    const uint64_t hash = KvBlocks::ChainHash(parent, block_tokens);
    blocks_.Register(b, parent, hash, block_tokens);
    s.blocks.push_back(b);
    s.hashes.push_back(hash);
    parent = hash;
  }
  stats_.kv_host_restored_tokens += (k - matched) * B;
  return k - matched;
}

// Adds positions [n_computed, n_computed + n) of `s` to the batch, with blocks for them
// (preempting another sequence if the pool is short). False if `s` could not run this step.
int64_t Engine::ChunkOf(Sequence& s, int64_t budget) {
  int64_t n = std::min(s.pending(), budget);
  if (!s.req.prompt_logprobs) return n;
  // Positions p with a prompt row (TakeTokens): next_prompt_logprob - 1 <= p < n_prompt - 1.
  const int64_t first_row = std::max(s.n_computed, s.next_prompt_logprob - 1);
  const int64_t end_row = std::min(s.n_computed + n, s.n_prompt - 1);
  if (end_row <= first_row) return n;
  if (end_row - first_row > prompt_rows_left_) n = first_row - s.n_computed + prompt_rows_left_;
  prompt_rows_left_ -= std::max<int64_t>(0, std::min(s.n_computed + n, end_row) - first_row);
  return n;
}

bool Engine::TakeTokens(Sequence& s, int64_t n, bool& preempted_self) {
  for (;;) {
    if (EnsureBlocks(s, s.n_computed + n) && MakeWritable(s, s.n_computed)) break;
    if (PreemptOneBesides(s)) continue;
    // Nobody else to preempt: `s` alone fills the pool.
    if (in_batch_.empty() && running_.size() == 1) {
      Finish(s, StopReason::kContextFull);
    } else {
      Preempt(s);
      preempted_self = true;
    }
    return false;
  }
  const int32_t index = static_cast<int32_t>(tables_.size());
  s.in_batch = true;
  s.step_tokens = n;
  in_batch_.push_back(&s);
  tables_.push_back(s.blocks);
  for (int64_t p = s.n_computed; p < s.n_computed + n; ++p) {
    tokens_.push_back(s.tokens[static_cast<size_t>(p)]);
    positions_.push_back(static_cast<int32_t>(p));
    seq_of_.push_back(index);
    if (s.req.prompt_logprobs && p + 1 < s.n_prompt && p + 1 >= s.next_prompt_logprob) {
      logit_rows_.push_back(static_cast<int32_t>(tokens_.size() - 1));
      logit_seq_.push_back(&s);
      row_prompt_token_.push_back(p + 1);
    }
  }
  if (s.n_computed + n == static_cast<int64_t>(s.tokens.size())) {
    logit_rows_.push_back(static_cast<int32_t>(tokens_.size() - 1));
    logit_seq_.push_back(&s);
    row_prompt_token_.push_back(-1);
  }
  return true;
}

bool Engine::EnsureBlocks(Sequence& s, int64_t n_positions) {
  const int64_t B = pool_.block_size();
  while (static_cast<int64_t>(s.blocks.size()) * B < n_positions) {
    const int32_t b = blocks_.Allocate();
    if (b < 0) return false;
    s.blocks.push_back(b);
  }
  return true;
}

// A block that is cached or held by others is copied before `position` is written into it.
bool Engine::MakeWritable(Sequence& s, int64_t position) {
  const size_t index = static_cast<size_t>(position / pool_.block_size());
  if (index >= s.blocks.size() || !blocks_.IsShared(s.blocks[index])) return true;
  const int32_t copy = blocks_.Allocate();
  if (copy < 0) return false;
  pool_.CopyBlock(s.blocks[index], copy);
  blocks_.Unref(s.blocks[index]);
  s.blocks[index] = copy;
  s.hashes.resize(std::min(s.hashes.size(), index));  // the copy is private until full again
  return true;
}

// Preempts the most recently admitted running sequence other than `s` that is not in this
// step's batch yet. False when there is none.
bool Engine::PreemptOneBesides(const Sequence& s) {
  for (size_t i = running_.size(); i-- > 0;) {
    Sequence& victim = *running_[i];
    if (&victim == &s || victim.in_batch || victim.finished || victim.requeue) continue;
    Preempt(victim);
    return true;
  }
  return false;
}

void Engine::Preempt(Sequence& s) {
  ReleaseBlocks(s);
  s.n_computed = 0;
  s.requeue = true;
  ++stats_.preemptions;
}

void Engine::ReleaseBlocks(Sequence& s) {
  for (int32_t b : s.blocks) blocks_.Unref(b);
  s.blocks.clear();
  s.hashes.clear();
}

// ---- after the forward ---------------------------------------------------------------------

bool Engine::Forced(const Sequence& s) {
  return s.n_generated < static_cast<int64_t>(s.req.forced_tokens.size());
}

void Engine::ChooseDeviceDraws() {
  draws_.clear();
  const bool on_device = options_.device_draws.value_or(Tuning().device_draws.value_or(1) != 0);
  if (!model_.CandidatesOnDevice() || !on_device) return;
  const int64_t vocab = model_.config().vocab_size;
  bool any = false;
  for (Sequence* s : logit_seq_) {
    RowDraw d;
    if (!Forced(*s) && s->sampler->DrawsOnDevice(vocab)) d = s->sampler->DeviceDraw();
    any = any || d.u >= 0.0;
    draws_.push_back(d);
  }
  if (!any) draws_.clear();
}

Engine::StepDraw Engine::ChooseStepDraw() const {
  const int64_t vocab = model_.config().vocab_size;
  bool argmax = true, top_k = model_.CandidatesOnDevice();
  for (size_t r = 0; r < logit_seq_.size(); ++r) {
    const Sequence* s = logit_seq_[r];
    if (WantsLogprobs(*s)) argmax = false;       // the arg-max ids alone give no log-probabilities
    if (IsPromptRow(r) || Forced(*s)) continue;  // nothing drawn
    argmax = argmax && s->sampler->DrawsArgMax();
    top_k = top_k && s->sampler->CandidatesRead(vocab) > 0;
  }
  return argmax                     ? StepDraw::kArgMax
         : top_k || !draws_.empty() ? StepDraw::kTopK
                                    : StepDraw::kLogits;
}

std::span<const int32_t> Engine::ScoredTokens(StepDraw draw) {
  scored_.clear();
  if (draw != StepDraw::kTopK) return {};
  bool any = false;
  for (size_t r = 0; r < logit_seq_.size(); ++r) {
    const Sequence& s = *logit_seq_[r];
    any = any || WantsLogprobs(s);
    const int64_t j = row_prompt_token_[r];
    scored_.push_back(j >= 0 ? s.tokens[static_cast<size_t>(j)] : -1);
  }
  if (!any) scored_.clear();
  return scored_;
}

void Engine::AfterForward(StepDraw draw) {
  for (Sequence* s : in_batch_) {
    s->n_computed += s->step_tokens;
    if (options_.prefix_cache) RegisterFullBlocks(*s);
  }
  if (draw == StepDraw::kArgMax)
    sample_status_.assign(logit_seq_.size(), OkStatus());
  else if (draw == StepDraw::kTopK)
    SampleCandidateRows();
  else
    SampleRows(logits_);
  for (size_t r = 0; r < logit_seq_.size(); ++r) {
    Sequence& s = *logit_seq_[r];
    if (!s.finished && !IsPromptRow(r) && Forced(s))
      sampled_[r] = s.req.forced_tokens[static_cast<size_t>(s.n_generated)];
  }
  RowLogprobs(draw);
  EmitPromptLogprobs();
  for (size_t r = 0; r < logit_seq_.size(); ++r) {
    Sequence& s = *logit_seq_[r];
    if (s.finished || IsPromptRow(r)) continue;
    if (!sample_status_[r].ok()) {
      Finish(s, StopReason::kCancelled, sample_status_[r]);
      continue;
    }
    OnToken(s, sampled_[r], WantsLogprobs(s) ? &row_logprobs_[r] : nullptr);
  }
}

bool Engine::WantsLogprobs(const Sequence& s) {
  return s.req.top_logprobs >= 0;
}

void Engine::RowLogprobs(StepDraw draw) {
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  const size_t n = logit_seq_.size();
  row_logprobs_.resize(n);
  auto wanted = [&](size_t r) {
    const Sequence& s = *logit_seq_[r];
    return !s.finished && WantsLogprobs(s) && sample_status_[r].ok();
  };
  auto token_of = [&](size_t r) {
    const int64_t j = row_prompt_token_[r];
    return j >= 0 ? logit_seq_[r]->tokens[static_cast<size_t>(j)] : sampled_[r];
  };
  auto of_row = [&](size_t r, std::span<const float> row) {
    row_logprobs_[r] = LogprobsOf(row, token_of(r), logit_seq_[r]->req.top_logprobs);
  };
  if (draw == StepDraw::kTopK) {  // from the candidates and sums, else the row read from the model
    for (size_t r = 0; r < n; ++r) {
      if (!wanted(r)) continue;
      // A row drawn on the device has the token drawn for its one candidate: its alternatives
      // come from the row.
      const bool drawn = !draws_.empty() && draws_[r].u >= 0.0;
      const bool alternatives = logit_seq_[r]->req.top_logprobs > 0;
      if (top_k_.counts[r] >= 0 && !top_k_.sums.empty() && !(drawn && alternatives)) {
        auto lp = LogprobsOfCandidates(top_k_.Row(r), top_k_.sums[r], token_of(r),
                                       logit_seq_[r]->req.top_logprobs, static_cast<int64_t>(V));
        if (lp) {
          row_logprobs_[r] = std::move(*lp);
          continue;
        }
      }
      const Status read = model_.LogitsRow(static_cast<int64_t>(r), row_logits_);
      if (read.ok())
        of_row(r, row_logits_);
      else
        sample_status_[r] = read;
    }
    return;
  }
  // The rows at hand: at once on the sampling threads (a prompt's can be hundreds).
  auto task = [&](size_t r, int) {
    if (wanted(r)) of_row(r, std::span<const float>(logits_.data() + r * V, V));
  };
  if (n > 1 && sample_pool_ != nullptr) {
    sample_pool_->ParallelTasks(n, task);
  } else {
    for (size_t r = 0; r < n; ++r) task(r, 0);
  }
}

void Engine::EmitPromptLogprobs() {
  for (size_t r = 0; r < logit_seq_.size();) {
    Sequence& s = *logit_seq_[r];
    size_t end = r;
    while (end < logit_seq_.size() && logit_seq_[end] == &s && IsPromptRow(end)) ++end;
    if (end == r) {
      ++r;
      continue;
    }
    if (!s.finished && sample_status_[r].ok()) {
      RequestEvent e;
      e.kind = RequestEvent::Kind::kPromptLogprobs;
      e.id = s.id;
      e.prompt_logprobs = std::span<const TokenLogprobs>(row_logprobs_.data() + r, end - r);
      e.first_prompt_token = row_prompt_token_[r];
      s.next_prompt_logprob = row_prompt_token_[end - 1] + 1;
      if (s.sink) s.sink(e);
    }
    r = end;
  }
}

void Engine::SampleCandidateRows() {
  const size_t n = logit_seq_.size();
  sampled_.assign(n, 0);
  sample_status_.assign(n, OkStatus());
  SamplerScratch& scratch = sample_scratch_[0];
  const int64_t vocab = model_.config().vocab_size;
  for (size_t r = 0; r < n; ++r) {
    Sequence& s = *logit_seq_[r];
    if (s.finished || IsPromptRow(r) || Forced(s)) continue;
    if (!draws_.empty() && draws_[r].u >= 0.0) {
      sampled_[r] = top_k_.cands[r * kMaxLogitCandidates].id;
      s.sampler->CommitDeviceDraw();
      continue;
    }
    if (top_k_.counts[r] >= 0 && s.sampler->CandidatesRead(vocab) > 0) {
      sampled_[r] = s.sampler->SampleCandidates(top_k_.Row(r), scratch);
      continue;
    }
    auto next = [&]() -> Expected<int32_t> {
      MT_RETURN_IF_ERROR(model_.LogitsRow(static_cast<int64_t>(r), row_logits_));
      return s.sampler->Sample(row_logits_, s.tokens, static_cast<size_t>(s.n_prompt), scratch);
    }();
    if (next.ok())
      sampled_[r] = *next;
    else
      sample_status_[r] = next.status();
  }
}

void Engine::SampleRows(const std::vector<float>& logits) {
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  const size_t n = logit_seq_.size();
  sampled_.assign(n, 0);
  sample_status_.assign(n, OkStatus());
  auto draw = [&](size_t r, int thread) {
    Sequence& s = *logit_seq_[r];
    if (s.finished || IsPromptRow(r) || Forced(s)) return;
    auto next = s.sampler->Sample(std::span<const float>(logits.data() + r * V, V), s.tokens,
                                  static_cast<size_t>(s.n_prompt),
                                  sample_scratch_[static_cast<size_t>(thread)]);
    if (next.ok())
      sampled_[r] = *next;
    else
      sample_status_[r] = next.status();
  };
  if (n > 1 && sample_pool_ != nullptr) {
    sample_pool_->ParallelTasks(n, draw);
  } else {
    for (size_t r = 0; r < n; ++r) draw(r, 0);
  }
}

// Registers every block of `s` that is full and computed, so later sequences can share it.
void Engine::RegisterFullBlocks(Sequence& s) {
  const int64_t B = pool_.block_size();
  while (static_cast<int64_t>(s.hashes.size() + 1) * B <= s.n_computed) {
    const size_t i = s.hashes.size();
    const uint64_t parent = i == 0 ? 0 : s.hashes[i - 1];
    const std::span<const int32_t> block_tokens(s.tokens.data() + i * static_cast<size_t>(B),
                                                static_cast<size_t>(B));
    const uint64_t hash = KvBlocks::ChainHash(parent, block_tokens);
    blocks_.Register(s.blocks[i], parent, hash, block_tokens);
    s.hashes.push_back(hash);
  }
}

void Engine::OnToken(Sequence& s, int32_t token, const TokenLogprobs* logprobs) {
  const Clock::time_point now = Clock::now();
  if (s.n_generated == 0) s.first_token = now;
  s.last_token = now;
  s.tokens.push_back(token);
  ++s.n_generated;
  const bool is_stop_id =
      std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), token) != s.req.stop_ids.end();
  s.piece.clear();
  // A stop id's text is not part of the answer.
  if (s.req.text && !is_stop_id) s.piece = s.stops->Push(s.decoder->Push(token));
  RequestEvent e;
  e.kind = RequestEvent::Kind::kToken;
  e.id = s.id;
  e.token = token;
  e.text = s.piece;
  e.logprobs = logprobs;
  if (s.sink) s.sink(e);
  if (s.cancelled) return Finish(s, StopReason::kCancelled);
  if (is_stop_id) return Finish(s, StopReason::kEos);
  if (s.req.text && s.stops->stopped()) return Finish(s, StopReason::kStopString);
  if (s.n_generated >= s.req.max_new_tokens) return Finish(s, StopReason::kMaxTokens);
  // The token just sampled needs a position of its own to be run for the next one.
  if (static_cast<int64_t>(s.tokens.size()) > max_sequence_positions_)
    return Finish(s, StopReason::kContextFull);
}

void Engine::Finish(Sequence& s, StopReason reason, Status status) {
  if (s.finished) return;
  s.finished = true;
  ReleaseBlocks(s);
  s.piece.clear();
  if (status.ok() && s.req.text && s.decoder && !s.stops->stopped()) {
    s.piece = s.stops->Push(s.decoder->Flush());
    s.piece += s.stops->Flush();
  }
  RequestEvent e;
  e.kind = RequestEvent::Kind::kFinished;
  e.id = s.id;
  e.text = s.piece;
  e.reason = reason;
  e.status = std::move(status);
  e.usage.prompt_tokens = s.n_prompt > 0 ? s.n_prompt : static_cast<int64_t>(s.req.prompt.size());
  e.usage.cached_tokens = std::max<int64_t>(0, s.cached_tokens);
  e.usage.generated_tokens = s.n_generated;
  if (s.admitted != Clock::time_point{}) e.timings.queue_ms = Ms(s.arrived, s.admitted);
  if (s.n_generated > 0) e.timings.ttft_ms = Ms(s.arrived, s.first_token);
  if (s.n_generated > 1)
    e.timings.decode_tokens_per_s =
        static_cast<double>(s.n_generated - 1) /
        std::chrono::duration<double>(s.last_token - s.first_token).count();
  if (s.sink) s.sink(e);
}

void Engine::RemoveFinished() {
  auto gone = [](const std::unique_ptr<Sequence>& s) { return s->finished; };
  running_.erase(std::remove_if(running_.begin(), running_.end(), gone), running_.end());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), gone), waiting_.end());
  future_.erase(std::remove_if(future_.begin(), future_.end(), gone), future_.end());
}

}  // namespace moetier
