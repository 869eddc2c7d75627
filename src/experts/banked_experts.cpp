#include "experts/banked_experts.h"

namespace moetier {

namespace {

std::vector<ExpertWeights> BankViews(const uint8_t* data, const ExpertLayout& layout,
                                     int64_t n_experts) {
  std::vector<ExpertWeights> experts;
  experts.reserve(static_cast<size_t>(n_experts));
  for (int64_t e = 0; e < n_experts; ++e) experts.push_back(layout.Views(data, e));
  return experts;
}

// A released layer's views: no data, but the dtype, shape and bytes of what they were.
std::vector<ExpertWeights> ShapesOnly(const ExpertTable& table, int64_t layer) {
  const size_t n = table.n_experts(layer);
  std::vector<ExpertWeights> shapes;
  shapes.reserve(n);
  for (size_t e = 0; e < n; ++e) {
    ExpertWeights w = table.Expert(layer, static_cast<int64_t>(e));
    w.gate.data = w.up.data = w.down.data = nullptr;
    shapes.push_back(std::move(w));
  }
  return shapes;
}

}  // namespace

BankedExperts::BankedExperts(int64_t n_layers, std::vector<int64_t> moe_layers,
                             std::vector<HostBank> banks, std::vector<ExpertLayout> layouts,
                             int64_t n_experts, std::vector<CpuCopy> copies)
    : moe_layers_(std::move(moe_layers)),
      banks_(std::move(banks)),
      layouts_(std::move(layouts)),
      copies_(std::move(copies)),
      table_(n_layers),
      cpu_table_(n_layers) {
  copies_.resize(banks_.size());
  for (size_t i = 0; i < moe_layers_.size(); ++i) {
    const int64_t layer = moe_layers_[i];
    table_.SetLayer(layer, BankViews(banks_[i].data(), layouts_[i], n_experts));
    const CpuCopy& c = copies_[i];
    cpu_table_.SetLayer(layer, c.bank.size() != 0
                                   ? BankViews(c.bank.data(), c.layout, n_experts)
                                   : BankViews(banks_[i].data(), layouts_[i], n_experts));
  }
}

uint64_t BankedExperts::ReleaseHost(std::span<const int64_t> layers) {
  uint64_t freed = 0;
  for (int64_t layer : layers)
    for (size_t i = 0; i < moe_layers_.size(); ++i) {
      if (moe_layers_[i] != layer || banks_[i].size() == 0) continue;
      freed += banks_[i].size() + copies_[i].bank.size();
      banks_[i] = HostBank();  // unpins or unlocks, and frees
      copies_[i].bank = HostBank();
      table_.SetLayer(layer, ShapesOnly(table_, layer));
      cpu_table_.SetLayer(layer, ShapesOnly(cpu_table_, layer));
    }
  return freed;
}

}  // namespace moetier
