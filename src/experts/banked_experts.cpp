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

}  // namespace moetier
