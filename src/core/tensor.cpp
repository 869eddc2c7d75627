#include "core/tensor.h"

#include <cstring>

namespace moetier {

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

float ElementAsF32(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, t.bytes() + 4 * i, 4);
      return v;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, t.bytes() + 8 * i, 8);
      return static_cast<float>(v);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.bytes() + 2 * i, 2);
      return Bf16ToF32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.bytes() + 2 * i, 2);
      return F16ToF32(h);
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, t.bytes() + 8 * i, 8);
      return static_cast<float>(v);
    }
    default:
      return 0.0f;
  }
}

std::vector<float> ToF32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.NumElements()));
  for (int64_t i = 0; i < t.NumElements(); ++i) out[static_cast<size_t>(i)] = ElementAsF32(t, i);
  return out;
}

}  // namespace moetier
