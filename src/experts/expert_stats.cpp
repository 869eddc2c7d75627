#include "experts/expert_stats.h"

#include <cstdio>

namespace moetier {

LayerExpertStats& LayerExpertStats::operator+=(const LayerExpertStats& d) {
  calls += d.calls;
  active_experts += d.active_experts;
  assignments += d.assignments;
  gpu_experts += d.gpu_experts;
  cpu_experts += d.cpu_experts;
  cache_hits += d.cache_hits;
  cache_misses += d.cache_misses;
  fetched_experts += d.fetched_experts;
  bytes_h2d += d.bytes_h2d;
  h2d_ns += d.h2d_ns;
  split_calls += d.split_calls;
  q_star_sum += d.q_star_sum;
  return *this;
}

ExpertStats::ExpertStats(std::vector<int64_t> moe_layers) {
  for (int64_t l : moe_layers) {
    if (l >= static_cast<int64_t>(index_of_.size()))
      index_of_.resize(static_cast<size_t>(l) + 1, -1);
    index_of_[static_cast<size_t>(l)] = static_cast<int64_t>(layers_.size());
    LayerExpertStats s;
    s.layer = l;
    layers_.push_back(s);
  }
}

void ExpertStats::Add(const LayerExpertStats& d) {
  if (d.layer < 0 || d.layer >= static_cast<int64_t>(index_of_.size())) return;
  const int64_t i = index_of_[static_cast<size_t>(d.layer)];
  if (i < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  layers_[static_cast<size_t>(i)] += d;
}

std::vector<LayerExpertStats> ExpertStats::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return layers_;
}

double MeanQStar(const LayerExpertStats& s) {
  return s.split_calls > 0 ? s.q_star_sum / static_cast<double>(s.split_calls) : 0.0;
}

double H2dGbPerS(int64_t bytes, int64_t ns) {
  return ns > 0 ? static_cast<double>(bytes) / static_cast<double>(ns) : 0.0;
}

namespace {

nlohmann::ordered_json LayerJson(const LayerExpertStats& s) {
  return {{"layer", s.layer},
          {"calls", s.calls},
          {"active_experts", s.active_experts},
          {"assignments", s.assignments},
          {"gpu_experts", s.gpu_experts},
          {"cpu_experts", s.cpu_experts},
          {"cache_hits", s.cache_hits},
          {"cache_misses", s.cache_misses},
          {"fetched_experts", s.fetched_experts},
          {"bytes_h2d", s.bytes_h2d},
          {"h2d_ns", s.h2d_ns},
          {"split_calls", s.split_calls},
          {"q_star", MeanQStar(s)}};
}

LayerExpertStats Totals(const std::vector<LayerExpertStats>& layers) {
  LayerExpertStats t;
  t.layer = -1;
  for (const LayerExpertStats& s : layers) t += s;
  return t;
}

}  // namespace

nlohmann::ordered_json ExpertStatsJson(const std::vector<LayerExpertStats>& layers) {
  nlohmann::ordered_json j;
  j["layers"] = nlohmann::ordered_json::array();
  for (const LayerExpertStats& s : layers) j["layers"].push_back(LayerJson(s));
  nlohmann::ordered_json t = LayerJson(Totals(layers));
  t.erase("layer");
  const LayerExpertStats tot = Totals(layers);
  const int64_t lookups = tot.cache_hits + tot.cache_misses;
  t["cache_hit_rate"] = lookups > 0 ? static_cast<double>(tot.cache_hits) / lookups : 0.0;
  t["h2d_gb_per_s"] = H2dGbPerS(tot.bytes_h2d, tot.h2d_ns);
  j["totals"] = t;
  return j;
}

std::string ExpertStatsSummary(const std::vector<LayerExpertStats>& layers) {
  const LayerExpertStats t = Totals(layers);
  char line[256];
  const double per_call = t.calls > 0 ? static_cast<double>(t.active_experts) / t.calls : 0.0;
  const double cpu_share =
      t.active_experts > 0 ? 100.0 * static_cast<double>(t.cpu_experts) / t.active_experts : 0.0;
  std::snprintf(line, sizeof line,
                "expert stats: %zu MoE layers, %lld calls, %.1f experts active a call, %.0f%% "
                "computed on the CPU, %.0f%% on the GPU, cache hits %lld / misses %lld, %.2f GB "
                "copied to the GPU at %.1f GB/s",
                layers.size(), static_cast<long long>(t.calls), per_call, cpu_share,
                t.active_experts > 0 ? 100.0 * static_cast<double>(t.gpu_experts) /
                                           static_cast<double>(t.active_experts)
                                     : 0.0,
                static_cast<long long>(t.cache_hits), static_cast<long long>(t.cache_misses),
                static_cast<double>(t.bytes_h2d) / 1e9, H2dGbPerS(t.bytes_h2d, t.h2d_ns));
  return line;
}

}  // namespace moetier
