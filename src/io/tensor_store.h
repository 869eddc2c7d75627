// TensorStore: named tensors already in memory (memory-mapped), whatever the file format: a
// Hugging Face checkpoint or a converted model's dense weights.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace moetier {

class TensorStore {
 public:
  virtual ~TensorStore() = default;
  // The view of `name`, or nullptr. Views live as long as the store.
  virtual const TensorView* Find(const std::string& name) const = 0;
  // The file holding `name`, for error messages.
  virtual std::string FileOf(const std::string& name) const = 0;
  // The file that describes the store (a safetensors file or an index), for error messages.
  virtual const std::string& description() const = 0;
  virtual std::vector<std::string> Names() const = 0;
};

}  // namespace moetier
