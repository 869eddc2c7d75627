// moetier batch: many requests from a JSONL file through the continuous-batching engine at once;
// one JSON line per request comes out, in the input's order.
//
// Everything that can be checked is checked before the weights load: the file's every line
// (batch_requests.h), the prompts' encoding and chat template (the tokenizer needs no weights),
// then, once config.json is read, the token ids against the vocabulary.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/batch_requests.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/text_generation.h"
#include "model/generation_config.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::cli {

namespace {

struct Opts {
  ModelOptions model;
  std::string requests_path;
  std::string out_path;
  int parallel = 4;
  int64_t max_batch_tokens = kDefaultMaxBatchTokens;
};

// One request on its way: its prompt ids, and what the engine has said about it so far.
struct Job {
  const BatchRequest* request = nullptr;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;  // generated ids, a stop id included
  std::string text;             // stop string excluded
  bool finished = false;
  StopReason reason = StopReason::kMaxTokens;
  Status status;
  RequestUsage usage;
  RequestTimings timings;
  std::vector<TokenLogprobs> logprobs;         // per generated token, when asked
  std::vector<TokenLogprobs> prompt_logprobs;  // per prompt token from the second, when asked
};

// The tokenizer, when a request needs it or the model ships one (then every answer carries its
// text); none for a model without tokenizer.json whose requests are all token ids.
Expected<std::optional<text::Tokenizer>> LoadTokenizer(const Opts& o,
                                                       const std::vector<BatchRequest>& requests) {
  const BatchRequest* needs = nullptr;
  for (const BatchRequest& r : requests)
    if (!needs && r.NeedsTokenizer()) needs = &r;
  std::error_code ec;
  const bool present = std::filesystem::is_regular_file(
      std::filesystem::path(o.model.model_dir) / "tokenizer.json", ec);
  if (!needs && !present) return std::optional<text::Tokenizer>();
  auto tok = text::Tokenizer::Load(o.model.model_dir);
  if (!tok.ok() && needs)
    return tok.status().WithContext(RequestWhere(o.requests_path, *needs) + ": field '" +
                                    (needs->prompt ? "prompt" : "stop") +
                                    "' needs the model's tokenizer");
  if (!tok.ok()) return tok.status();
  return std::optional<text::Tokenizer>(std::move(*tok));
}

// A text prompt's ids: the text as tokenizer(text) encodes it, or the chat template's rendering
// of it as one user message, with the assistant's turn opened.
Expected<std::vector<int32_t>> EncodePrompt(const BatchRequest& r, const text::Tokenizer& tok,
                                            const std::string& model_dir,
                                            std::optional<text::ChatTemplate>& chat) {
  if (!r.chat) return tok.Encode(*r.prompt, /*add_special_tokens=*/true);
  if (!chat) {
    MT_ASSIGN_OR_RETURN(text::ChatTemplate loaded, text::ChatTemplate::Load(model_dir));
    chat.emplace(std::move(loaded));
  }
  text::ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::array();
  in.messages.push_back({{"role", "user"}, {"content", *r.prompt}});
  in.tools = nullptr;
  in.add_generation_prompt = true;
  MT_ASSIGN_OR_RETURN(std::string rendered, chat->Render(in));
  return tok.Encode(rendered, /*add_special_tokens=*/false);  // the template writes BOS
}

// Every job's prompt ids (before the weights load: the tokenizer and template need none).
Expected<std::vector<Job>> MakeJobs(const Opts& o, const std::vector<BatchRequest>& requests,
                                    const text::Tokenizer* tok) {
  std::vector<Job> jobs(requests.size());
  std::optional<text::ChatTemplate> chat;
  for (size_t i = 0; i < requests.size(); ++i) {
    const BatchRequest& r = requests[i];
    jobs[i].request = &r;
    if (!r.prompt) {
      jobs[i].prompt = r.tokens;
      continue;
    }
    const std::string where = RequestWhere(o.requests_path, r);
    auto ids = EncodePrompt(r, *tok, o.model.model_dir, chat);
    if (!ids.ok()) return ids.status().WithContext(where + ": field 'chat'");
    if (ids->empty()) return Status::Error(where + ": field 'prompt' encodes to no tokens");
    jobs[i].prompt = std::move(*ids);
  }
  return jobs;
}

// Once config.json is read: the ids against the vocabulary, and the model's stop ids.
Status CheckJobs(const Opts& o, const ModelConfig& config, const text::Tokenizer* tok,
                 const std::vector<Job>& jobs, std::vector<int32_t>& stop_ids) {
  for (const Job& j : jobs) {
    const std::string field = RequestWhere(o.requests_path, *j.request) +
                              (j.request->prompt ? ": field 'prompt' (tokenizer.json and the "
                                                   "model disagree)"
                                                 : ": field 'tokens'");
    MT_RETURN_IF_ERROR(CheckTokenIds(j.prompt, config, field));
  }
  MT_ASSIGN_OR_RETURN(stop_ids, ReadStopTokenIds(o.model.model_dir, config));
  if (tok) stop_ids = StopIdsFor(std::move(stop_ids), *tok);
  return OkStatus();
}

RequestOptions ToRequestOptions(const Job& j, const std::vector<int32_t>& stop_ids, bool with_text,
                                int64_t sequence_limit) {
  const BatchRequest& r = *j.request;
  RequestOptions q;
  q.prompt = j.prompt;
  q.sampler = r.sampler;
  q.sampler.seed = r.seed ? *r.seed : std::random_device{}();
  // No sequence generates more tokens than it holds positions; the engine reserves room for
  // max_new_tokens up front, so an "as many as fit" 10^18 must not reach it as such.
  q.max_new_tokens = std::min(r.max_new_tokens, sequence_limit);
  if (!r.ignore_eos) q.stop_ids = stop_ids;
  q.stop_strings = r.stop;
  q.text = with_text;
  q.arrival_step = r.after;
  q.top_logprobs = r.logprobs;
  q.prompt_logprobs = r.prompt_logprobs;
  return q;
}

// `v` to `per_unit`ths (1000: thousandths), so that it prints short.
double Rounded(double v, double per_unit) {
  return std::round(v * per_unit) / per_unit;
}

// [{"token", "logprob", "top": [[id, logprob], ...]}, ...]; a token that cannot follow: -9999
// (as the OpenAI API writes it), so that every value is a JSON number.
nlohmann::ordered_json LogprobsJson(const std::vector<TokenLogprobs>& entries) {
  auto value = [](float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; };
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const TokenLogprobs& e : entries) {
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (const TokenLogprob& t : e.top) top.push_back({t.token, value(t.logprob)});
    list.push_back({{"token", e.chosen.token}, {"logprob", value(e.chosen.logprob)}, {"top", top}});
  }
  return list;
}

std::string ResultLine(const Job& j, bool with_text) {
  nlohmann::ordered_json line;
  line["id"] = j.request->id;
  if (!j.status.ok()) {
    line["error"] = j.status.message();
  } else {
    line["tokens"] = j.tokens;
    if (with_text) line["text"] = j.text;
    line["finish_reason"] = StopReasonName(j.reason);
    line["prompt_tokens"] = j.usage.prompt_tokens;
    line["cached_tokens"] = j.usage.cached_tokens;
    line["ttft_ms"] = Rounded(j.timings.ttft_ms, 1000);
    line["decode_tokens_per_s"] = Rounded(j.timings.decode_tokens_per_s, 100);
    if (j.request->logprobs >= 0) line["logprobs"] = LogprobsJson(j.logprobs);
    if (j.request->prompt_logprobs) line["prompt_logprobs"] = LogprobsJson(j.prompt_logprobs);
  }
  return line.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace) + "\n";
}

// Writes each job's line as soon as it and every job before it have finished, so the output
// keeps the input's order and a long run shows its progress.
class OrderedWriter {
 public:
  OrderedWriter(std::FILE* out, const std::vector<Job>& jobs, bool with_text)
      : out_(out), jobs_(jobs), with_text_(with_text) {}
  void Flush() {
    while (next_ < jobs_.size() && jobs_[next_].finished) {
      const std::string line = ResultLine(jobs_[next_++], with_text_);
      std::fwrite(line.data(), 1, line.size(), out_);
    }
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
  const std::vector<Job>& jobs_;
  bool with_text_;
  size_t next_ = 0;
};

// The run in numbers, on one line of stderr (a line per request would drown 1000 of them).
void PrintSummary(const std::vector<Job>& jobs, const EngineStats& stats, double wall_s) {
  int64_t failed = 0, prompt = 0, cached = 0, generated = 0;
  for (const Job& j : jobs) {
    failed += j.status.ok() ? 0 : 1;
    prompt += j.usage.prompt_tokens;
    cached += j.usage.cached_tokens;
    generated += j.usage.generated_tokens;
  }
  std::fprintf(stderr,
               "batch: %zu request%s (%lld failed) in %.2f s: %lld tokens generated, %.1f "
               "tokens/s; %lld prompt tokens, %lld of them from the prefix cache; %lld steps, "
               "%lld preemptions\n",
               jobs.size(), jobs.size() == 1 ? "" : "s", static_cast<long long>(failed), wall_s,
               static_cast<long long>(generated),
               wall_s > 0 ? static_cast<double>(generated) / wall_s : 0.0,
               static_cast<long long>(prompt), static_cast<long long>(cached),
               static_cast<long long>(stats.steps), static_cast<long long>(stats.preemptions));
}

// Submits every job, drives the engine until all have finished and writes their lines.
// Returns the number of failed requests.
int64_t RunJobs(Engine& engine, std::vector<Job>& jobs, const std::vector<int32_t>& stop_ids,
                bool with_text, std::FILE* out) {
  OrderedWriter writer(out, jobs, with_text);
  const auto start = std::chrono::steady_clock::now();
  for (Job& j : jobs) {
    engine.Submit(ToRequestOptions(j, stop_ids, with_text, engine.sequence_limit()),
                  [&j, &writer](const RequestEvent& e) {
                    j.text += e.text;
                    if (e.kind == RequestEvent::Kind::kPromptLogprobs) {
                      j.prompt_logprobs.insert(j.prompt_logprobs.end(), e.prompt_logprobs.begin(),
                                               e.prompt_logprobs.end());
                      return;
                    }
                    if (e.kind == RequestEvent::Kind::kToken) {
                      j.tokens.push_back(e.token);
                      if (e.logprobs != nullptr) j.logprobs.push_back(*e.logprobs);
                      return;
                    }
                    j.finished = true;
                    j.reason = e.reason;
                    j.status = e.status;
                    j.usage = e.usage;
                    j.timings = e.timings;
                    writer.Flush();
                  });
  }
  engine.RunUntilIdle();
  writer.Flush();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  PrintSummary(jobs, engine.stats(), wall_s);
  int64_t failed = 0;
  for (const Job& j : jobs) failed += j.status.ok() ? 0 : 1;
  return failed;
}

int RunBatch(const Opts& o) {
  if (!o.out_path.empty())
    if (Status s = CheckWritableFile(o.out_path, "--out"); !s.ok()) return ReportError(s.message());
  auto file = ReadInputFile(o.requests_path, "--requests");
  if (!file.ok()) return ReportError(file.message());
  auto requests = ParseBatchRequests(*file, o.requests_path);
  if (!requests.ok()) return ReportError(requests.message());
  auto tok = LoadTokenizer(o, *requests);
  if (!tok.ok()) return ReportError(tok.message());
  const text::Tokenizer* tokenizer = tok->has_value() ? &**tok : nullptr;
  auto jobs = MakeJobs(o, *requests, tokenizer);
  if (!jobs.ok()) return ReportError(jobs.message());
  std::vector<int32_t> stop_ids;
  auto model = LoadModel(o.model, [&](const ModelConfig& config) {
    return CheckJobs(o, config, tokenizer, *jobs, stop_ids);
  });
  if (!model.ok()) return ReportError(model.message());
  auto engine = MakeEngine(o.model, **model, tokenizer, o.parallel, o.max_batch_tokens);
  if (!engine.ok()) return ReportError(engine.message());

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out_file(nullptr, &std::fclose);
  if (!o.out_path.empty()) {
    out_file.reset(std::fopen(o.out_path.c_str(), "w"));
    if (!out_file) return ReportError(o.out_path + ": cannot open for writing (--out)");
  }
  std::FILE* out = out_file ? out_file.get() : stdout;
  const int64_t failed = RunJobs(**engine, *jobs, stop_ids, tokenizer != nullptr, out);
  if (Status s = FinishModel(o.model, **model); !s.ok()) return ReportError(s.message());
  if (std::ferror(out) || (out_file && std::fclose(out_file.release()) != 0))
    return ReportError((o.out_path.empty() ? std::string("stdout") : o.out_path) +
                       ": write failed" + (o.out_path.empty() ? "" : " (--out)"));
  if (failed > 0)
    return ReportError(std::to_string(failed) + " of " + std::to_string(jobs->size()) +
                       " requests failed; their lines in " +
                       (o.out_path.empty() ? std::string("stdout") : o.out_path) +
                       " say why in \"error\"");
  return 0;
}

}  // namespace

Command AddBatchCommand(CLI::App& root) {
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "batch",
      "Run many requests at once through the continuous-batching engine. --requests is JSONL, "
      "one request a line: {\"id\": 1, \"prompt\": \"Hello\"} or {\"id\": \"b\", \"tokens\": "
      "[3,17,42]}, with optional max_new_tokens (256), temperature (0: greedy), top_k, top_p, "
      "min_p, repetition_penalty, seed, stop (a string or a list), chat (render prompt with the "
      "chat template), ignore_eos, after (join after that many engine steps), logprobs (N from "
      "0 to 20: each generated token's log-probability and the N most likely tokens'), "
      "prompt_logprobs (true: also each prompt token's from the second). Every line is checked "
      "before the model loads. Prints one JSON line per request in the input's order: id, "
      "tokens, text, finish_reason, prompt_tokens, cached_tokens, ttft_ms, decode_tokens_per_s "
      "(and logprobs, prompt_logprobs: [{\"token\", \"logprob\", \"top\": [[id, logprob], "
      "...]}, ...] when asked), or id and error for a request that failed (then the exit status "
      "is 1, after every line). A summary goes to stderr.");
  AddModelOptions(*cmd, o->model);
  cmd->add_option("--requests", o->requests_path, "The requests, one JSON object a line")
      ->required();
  cmd->add_option("--out", o->out_path, "Write the results to this file instead of stdout");
  cmd->add_option("--parallel", o->parallel, "Most sequences running at once")
      ->check(WholeNumber(1, std::numeric_limits<int>::max()));
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Most tokens in one engine step, over all sequences (a longer prompt is "
                  "prefilled in chunks, so the others keep decoding)")
      ->check(WholeNumber(1, kMaxContext));
  return {cmd, [o]() -> int { return RunBatch(*o); }};
}

}  // namespace moetier::cli
