// WeightBinder: fetches named tensors from a checkpoint for an architecture's loader, checking
// each against the shape the config implies and the dtype the config declares. It records the
// first failure so an architecture file can list its tensors plainly and check once at the end.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/tensor_store.h"
#include "model/config.h"

namespace moetier {

// Where one routed expert's matrix [rows, cols] sits in a checkpoint: a tensor of its own
// (Hugging Face's model.layers.3.mlp.experts.5.gate_proj.weight), or expert `stacked_expert`'s
// rows of a tensor that stacks the layer's experts, [n_experts, rows, cols] (GGUF's
// blk.3.ffn_gate_exps.weight). Each architecture file names its experts through one
// (ArchSpec::expert_tensor).
struct ExpertTensorBinding {
  static constexpr int64_t kOwnTensor = -1;

  std::string name;
  int64_t stacked_expert = kOwnTensor;  // the index along a stacked tensor's first dimension

  bool stacked() const { return stacked_expert >= 0; }
};

class WeightBinder {
 public:
  WeightBinder(const TensorStore& checkpoint, const ModelConfig& config)
      : checkpoint_(checkpoint), config_(config) {}

  // The view of `name`, which must exist with exactly `shape`.
  TensorView Matrix(const std::string& name, std::vector<int64_t> shape);
  // The view of one expert's matrix of `shape` [rows, cols] where `t` places it: the tensor of
  // exactly that shape, or the expert's slice of a stacked [n_experts, rows, cols] tensor (a view
  // into it, not a copy). requested() records the tensor's name.
  TensorView Expert(const ExpertTensorBinding& t, std::vector<int64_t> shape, int64_t n_experts);
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
