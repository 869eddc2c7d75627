// WeightBinder: fetches named tensors from a checkpoint for an architecture's loader, checking
// each against the shape the config implies and the dtype the config declares. It records the
// first failure so an architecture file can list its tensors plainly and check once at the end.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/tensor_store.h"
#include "model/config.h"

namespace moetier {

class WeightBinder {
 public:
  WeightBinder(const TensorStore& checkpoint, const ModelConfig& config)
      : checkpoint_(checkpoint), config_(config) {}

  // The view of `name`, which must exist with exactly `shape`.
  TensorView Matrix(const std::string& name, std::vector<int64_t> shape);
  // A small vector (norm weight, bias) converted to float32.
  std::vector<float> Vector(const std::string& name, int64_t n);
  bool Has(const std::string& name) const { return checkpoint_.Find(name) != nullptr; }

  // The first failure, or OK.
  const Status& status() const { return status_; }
  // Every name Matrix and Vector were asked for, found or not: once status() is OK after an
  // architecture bound its weights, the tensors it reads (convert refuses the others).
  const std::set<std::string>& requested() const { return requested_; }

 private:
  const TensorView* Lookup(const std::string& name, const std::vector<int64_t>& shape);

  const TensorStore& checkpoint_;
  const ModelConfig& config_;
  Status status_;
  std::set<std::string> requested_;
};

}  // namespace moetier
