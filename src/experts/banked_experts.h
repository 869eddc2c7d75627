// BankedExperts: the ExpertSource over host banks, one per MoE layer, each settled to a tier.
// Owns the banks; the views it hands out point into them.
#pragma once

#include <vector>

#include "experts/expert_layout.h"
#include "experts/expert_table.h"
#include "experts/host_bank.h"

namespace moetier {

// A layer's second bank: its experts packed for the CPU executor, beside the bank a GPU reads
// (residency_plan.h, LayerResidency::cpu_copy_bytes). An empty bank: none.
struct CpuCopy {
  HostBank bank;
  ExpertLayout layout;
};

class BankedExperts final : public ExpertSource {
 public:
  // banks[i] holds layer moe_layers[i]'s n_experts experts in layouts[i] (layers may differ in
  // format: a bank the CPU runs may be packed, one pinned for the GPU is as stored). copies:
  // empty, or one per bank.
  BankedExperts(int64_t n_layers, std::vector<int64_t> moe_layers, std::vector<HostBank> banks,
                std::vector<ExpertLayout> layouts, int64_t n_experts,
                std::vector<CpuCopy> copies = {});

  const ExpertWeights& Expert(int64_t layer, int64_t expert) const override {
    return table_.Expert(layer, expert);
  }
  const ExpertWeights& CpuExpert(int64_t layer, int64_t expert) const override {
    return cpu_table_.Expert(layer, expert);
  }
  uint64_t ReleaseHost(std::span<const int64_t> layers) override;
  const std::vector<int64_t>& moe_layers() const { return moe_layers_; }
  const HostBank& bank(size_t i) const { return banks_[i]; }
  const ExpertLayout& layout(size_t i) const { return layouts_[i]; }
  // Bank i's copy for the CPU executor (an empty bank: none).
  const CpuCopy& cpu_copy(size_t i) const { return copies_[i]; }

 private:
  std::vector<int64_t> moe_layers_;
  std::vector<HostBank> banks_;
  std::vector<ExpertLayout> layouts_;
  std::vector<CpuCopy> copies_;  // one per bank
  ExpertTable table_;
  ExpertTable cpu_table_;  // the copies' views where a layer has one, else table_'s
};

}  // namespace moetier
