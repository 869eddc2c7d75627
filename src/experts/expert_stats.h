// --moe-collect-stats: per MoE layer, what the expert executors did — calls, experts activated,
// where they ran, and (with an expert cache) hits, misses and bytes copied to the GPU. Written by
// the backend on the engine's thread, read by anyone (the report at exit, bench --json, the
// server's residency page) through Snapshot.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moetier {

struct LayerExpertStats {
  int64_t layer = 0;
  int64_t calls = 0;            // Moe calls (steps that ran this layer)
  int64_t active_experts = 0;   // summed over calls: experts chosen by any token of the step
  int64_t assignments = 0;      // summed over calls: (token, expert) pairs
  int64_t gpu_experts = 0;      // of active_experts, computed on the GPU
  int64_t cpu_experts = 0;      // of active_experts, computed by the CPU executor
  int64_t cache_hits = 0;       // GPU expert cache (offload): experts found in a slot
  int64_t cache_misses = 0;     // ... and not found: fetched, or (hybrid) computed by the CPU
  int64_t fetched_experts = 0;  // experts copied host to device (misses fetched, banks streamed)
  int64_t bytes_h2d = 0;        // bytes copied host to device for this layer's experts
  // The copy engine's time on those copies, ns: per step, from the start of the layer's first
  // copy to the end of its last (CUDA events); bytes_h2d / h2d_ns is their effective speed.
  int64_t h2d_ns = 0;
  // Hybrid: the steps whose misses were split between the copy engine and the CPU, and the sum
  // of the q* (share of the misses for the copy engine) in force at each.
  int64_t split_calls = 0;
  double q_star_sum = 0;
  // Adds every counter of d (not the layer id).
  LayerExpertStats& operator+=(const LayerExpertStats& d);
};

class ExpertStats {
 public:
  explicit ExpertStats(std::vector<int64_t> moe_layers);
  // Adds to layer `layer` (a MoE layer of the constructor's list; others are ignored).
  void Add(const LayerExpertStats& delta);
  std::vector<LayerExpertStats> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<LayerExpertStats> layers_;
  std::vector<int64_t> index_of_;  // layer id -> index in layers_, or -1
};

// {"layers": [{"layer", "calls", ...}], "totals": {...}}
nlohmann::ordered_json ExpertStatsJson(const std::vector<LayerExpertStats>& layers);
// "experts: 4 layers, 123 calls, 6.2 active/call, 100% on the CPU" (one line for stderr)
std::string ExpertStatsSummary(const std::vector<LayerExpertStats>& layers);

// Effective copy speed, GB/s (bytes per ns), of `bytes` copied in `ns` of copy-engine time; 0
// when nothing was timed.
double H2dGbPerS(int64_t bytes, int64_t ns);
// The mean q* over s's split steps (0 when none).
double MeanQStar(const LayerExpertStats& s);

}  // namespace moetier
