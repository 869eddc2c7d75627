// Non-owning views of tensors. The bytes belong to whoever mapped or allocated them (a
// MappedFile, a host bank); a view must not outlive that owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moetier {

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first
  const void* data = nullptr;
  size_t n_bytes = 0;

  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(size_t i) const { return shape.at(i); }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(data); }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

// "[512, 64]"
std::string ShapeToString(const std::vector<int64_t>& shape);

// Reads element i of a float-like tensor (f32/f16/bf16/f64) as float32. For tests and slow paths.
float ElementAsF32(const TensorView& t, int64_t i);

// Copies a float-like tensor into float32.
std::vector<float> ToF32(const TensorView& t);

}  // namespace moetier
