#include "model/weight_binder.h"

namespace moetier {

const TensorView* WeightBinder::Lookup(const std::string& name, const std::vector<int64_t>& shape) {
  requested_.insert(name);
  if (!status_.ok()) return nullptr;
  const TensorView* v = checkpoint_.Find(name);
  if (v == nullptr) {
    status_ = Status::Error(checkpoint_.description() + ": missing tensor '" + name + "', which " +
                            config_.architecture + " needs");
    return nullptr;
  }
  const std::string file = checkpoint_.FileOf(name);
  if (!IsWeightDType(v->dtype)) {
    status_ = Status::Error(file + ": tensor '" + name + "' has dtype " +
                            std::string(DTypeName(v->dtype)) +
                            "; weights must be BF16, F16, F32, Q8_0 or Q4_0");
    return nullptr;
  }
  // A converted model's matrices may be in the dtype its index says convert chose; anything
  // else must match config.json (a Hugging Face checkpoint always must). BF16C holds bf16's
  // values exactly (packed by convert, or at load: model/dense_holding.h), so it is accepted
  // wherever bf16 is.
  const auto matches = [&](DType want) {
    return v->dtype == want || (v->dtype == DType::kBF16C && want == DType::kBF16);
  };
  const bool converted = config_.converted_dense_dtype && matches(*config_.converted_dense_dtype);
  if (config_.declared_dtype && !matches(*config_.declared_dtype) && !converted) {
    status_ = Status::Error(file + ": tensor '" + name + "' is " +
                            std::string(DTypeName(v->dtype)) + " but " + config_.source +
                            " declares " + std::string(DTypeName(*config_.declared_dtype)));
    return nullptr;
  }
  if (v->shape != shape) {
    status_ = Status::Error(file + ": tensor '" + name + "' has shape " + ShapeToString(v->shape) +
                            " but " + config_.source + " implies " + ShapeToString(shape));
    return nullptr;
  }
  return v;
}

TensorView WeightBinder::Matrix(const std::string& name, std::vector<int64_t> shape) {
  const TensorView* v = Lookup(name, shape);
  return v ? *v : TensorView{};
}

TensorView WeightBinder::Expert(const ExpertTensorBinding& t, std::vector<int64_t> shape,
                                int64_t n_experts) {
  if (!t.stacked()) return Matrix(t.name, std::move(shape));
  std::vector<int64_t> stacked_shape = {n_experts};
  stacked_shape.insert(stacked_shape.end(), shape.begin(), shape.end());
  const TensorView* v = Lookup(t.name, stacked_shape);
  if (v == nullptr) return TensorView{};
  // Rows through DTypeRowBytes: a block format has no per-element size.
  const size_t slice_bytes = static_cast<size_t>(shape[0]) * DTypeRowBytes(v->dtype, shape[1]);
  const size_t offset = static_cast<size_t>(t.stacked_expert) * slice_bytes;
  if (t.stacked_expert >= n_experts || offset + slice_bytes > v->n_bytes) {
    status_ = Status::Error(checkpoint_.FileOf(t.name) + ": tensor '" + t.name + "' (shape " +
                            ShapeToString(stacked_shape) + ", " + std::to_string(v->n_bytes) +
                            " bytes) holds no expert " + std::to_string(t.stacked_expert));
    return TensorView{};
  }
  return TensorView{v->dtype, std::move(shape), v->bytes() + offset, slice_bytes};
}

std::vector<float> WeightBinder::Vector(const std::string& name, int64_t n) {
  const TensorView* v = Lookup(name, {n});
  if (v != nullptr && IsBlockFormat(v->dtype)) {
    // convert never quantizes 1-D tensors, and ToF32 reads only float dtypes.
    status_ = Status::Error(checkpoint_.FileOf(name) + ": tensor '" + name + "' is " +
                            std::string(DTypeName(v->dtype)) +
                            "; norms and biases must be BF16, F16 or F32: re-run moetier convert");
    return {};
  }
  return v ? ToF32(*v) : std::vector<float>{};
}

}  // namespace moetier
