// BankedExperts: the ExpertSource over host banks, one per MoE layer, each settled to a tier.
// Owns the banks; the views it hands out point into them.
#pragma once

#include <vector>

#include "experts/expert_layout.h"
#include "experts/expert_table.h"
#include "experts/host_bank.h"

namespace moetier {

class BankedExperts final : public ExpertSource {
 public:
  // banks[i] holds layer moe_layers[i]'s n_experts experts in `layout`.
  BankedExperts(int64_t n_layers, std::vector<int64_t> moe_layers, std::vector<HostBank> banks,
                ExpertLayout layout, int64_t n_experts);

  const ExpertWeights& Expert(int64_t layer, int64_t expert) const override {
    return table_.Expert(layer, expert);
  }
  const std::vector<int64_t>& moe_layers() const { return moe_layers_; }
  const HostBank& bank(size_t i) const { return banks_[i]; }
  const ExpertLayout& layout() const { return layout_; }

 private:
  std::vector<int64_t> moe_layers_;
  std::vector<HostBank> banks_;
  ExpertLayout layout_;
  ExpertTable table_;
};

}  // namespace moetier
