// The live residency page of `moetier serve`: GET /residency serves ResidencyPageHtml() (one
// self-contained HTML document: no file on disk, no external URL), which polls GET /v1/residency
// (ResidencyJson) about once a second and shows, per MoE layer, the tier planned and the tier
// settled, the bytes held, and what the expert executors did (calls, active experts, experts
// computed on the CPU and on the GPU, expert-cache hits and misses, bytes copied to the GPU),
// with the budgets, VmLck, the backend and the tokens generated a second.
//
// The live per-layer counters exist only when the model collects them: call
// CausalLM::CollectExpertStats() once after loading and before serving (the page says so when it
// was not called, and shows the residency alone).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/causal_lm.h"
#include "server/chat_service.h"

namespace moetier::server {

// The body of GET /v1/residency:
//   {"model", "uptime_s", "backend", "stored_dtype", "read_mode" (when known),
//    "pin_budget_bytes": n|null, "lock_budget_bytes": n|null,
//    "vmlck_bytes" (read now), "vmlck_settled_bytes" (after loading),
//    "bytes": {"gpu","pinned","locked","pageable"}, "dense" (cpu backend), "warnings": [...],
//    "expert_stats": bool (whether the counters below are collected),
//    "layers": [{"layer", "planned", "settled" (null for a model never settled), "bytes",
//                "dtype", "calls", "active_experts", "assignments", "gpu_experts",
//                "cpu_experts", "cache_hits", "cache_misses", "bytes_h2d"}],
//    "totals": {the same counters summed, "cache_hit_rate"} (null without expert_stats),
//    "requests": {"running", "waiting", "total"},
//    "tokens": {"prompt_total", "cached_prompt_total", "generated_total",
//               "forwarded_total" (tokens run through the model, prompt and generated, counted
//               at each step from the expert statistics; null without them)},
//    "kv_blocks": {"used", "total"}}
// One entry per MoE layer, ascending; the counters are null without expert_stats. Counters only
// grow, so a client takes rates from two polls: tokens/s is the change of a token count over the
// change of uptime_s (a monotonic clock, unlike wall time). generated_total grows as the service
// counts (ServiceMetrics); forwarded_total grows with every engine step.
//
// "model" and "warnings" hold file names, which need not be UTF-8: dump the body with
// nlohmann::json::error_handler_t::replace.
//
// Thread-safe once the model is loaded and CollectExpertStats was called (the residency report
// is set at load and not changed afterwards; the counters are read under their own lock).
nlohmann::ordered_json ResidencyJson(const CausalLM& model, const ServiceMetrics& metrics,
                                     double uptime_s);

// The page served at GET /residency (text/html; charset=utf-8). It fetches "/v1/residency" with
// the API key taken from the page address's fragment (/residency#key=KEY, which the browser
// never sends to the server) when there is one.
const std::string& ResidencyPageHtml();

}  // namespace moetier::server
