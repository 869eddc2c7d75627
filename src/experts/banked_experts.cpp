#include "experts/banked_experts.h"

namespace moetier {

BankedExperts::BankedExperts(int64_t n_layers, std::vector<int64_t> moe_layers,
                             std::vector<HostBank> banks, std::vector<ExpertLayout> layouts,
                             int64_t n_experts)
    : moe_layers_(std::move(moe_layers)),
      banks_(std::move(banks)),
      layouts_(std::move(layouts)),
      table_(n_layers) {
  for (size_t i = 0; i < moe_layers_.size(); ++i) {
    std::vector<ExpertWeights> experts;
    experts.reserve(static_cast<size_t>(n_experts));
    for (int64_t e = 0; e < n_experts; ++e)
      experts.push_back(layouts_[i].Views(banks_[i].data(), e));
    table_.SetLayer(moe_layers_[i], std::move(experts));
  }
}

uint64_t BankedExperts::ReleaseHost(std::span<const int64_t> layers) {
  uint64_t freed = 0;
  for (int64_t layer : layers)
    for (size_t i = 0; i < moe_layers_.size(); ++i) {
      if (moe_layers_[i] != layer || banks_[i].size() == 0) continue;
      freed += banks_[i].size();
      banks_[i] = HostBank();  // unpins or unlocks, and frees
      const size_t n = table_.n_experts(layer);
      std::vector<ExpertWeights> shapes;
      shapes.reserve(n);
      for (size_t e = 0; e < n; ++e) {
        ExpertWeights w = table_.Expert(layer, static_cast<int64_t>(e));
        w.gate.data = w.up.data = w.down.data = nullptr;
        shapes.push_back(std::move(w));
      }
      table_.SetLayer(layer, std::move(shapes));
    }
  return freed;
}

}  // namespace moetier
