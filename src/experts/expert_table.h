// An ExpertSource over views that already exist (a checkpoint's memory maps): a table
// [layer][expert] filled by the architecture's loader. Dense layers have empty rows.
#pragma once

#include <vector>

#include "ops/expert_source.h"

namespace moetier {

class ExpertTable final : public ExpertSource {
 public:
  explicit ExpertTable(int64_t n_layers) : table_(static_cast<size_t>(n_layers)) {}

  void SetLayer(int64_t layer, std::vector<ExpertWeights> experts) {
    table_[static_cast<size_t>(layer)] = std::move(experts);
  }
  const ExpertWeights& Expert(int64_t layer, int64_t expert) const override {
    return table_[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
  }
  size_t n_experts(int64_t layer) const { return table_[static_cast<size_t>(layer)].size(); }

 private:
  std::vector<std::vector<ExpertWeights>> table_;
};

}  // namespace moetier
