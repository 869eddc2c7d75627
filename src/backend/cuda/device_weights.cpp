#include "backend/cuda/device_weights.h"

#include <string>

#include "kernels/cuda/bf16c_expand.h"

namespace moetier::cuda {

namespace {

bool GpuReads(DType d) {
  return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kQ8_0 ||
         d == DType::kQ4_0;
}

}  // namespace

Expected<DeviceBuffer<uint8_t>> DeviceWeights::Upload(const void* host, size_t n_bytes,
                                                      const std::string& what) {
  MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> b, DeviceBuffer<uint8_t>::Create(n_bytes, what));
  MT_CUDA_RETURN_IF_ERROR(cudaMemcpy(b.data(), host, n_bytes, cudaMemcpyHostToDevice),
                          "copying " + what + " to the GPU");
  bytes_ += n_bytes;
  return b;
}

Status DeviceWeights::AddDense(std::span<const TensorView* const> matrices,
                               std::span<const std::vector<float>* const> vectors) {
  for (const TensorView* m : matrices) {
    if (matrices_.count(m->data) != 0) continue;
    if (m->shape.size() != 2 || !GpuReads(m->dtype))
      return Status::Error("a dense weight " + ShapeToString(m->shape) + " of dtype " +
                           std::string(DTypeName(m->dtype)) +
                           " cannot run on the GPU (2-D f32, f16, bf16, q8_0 or q4_0 only)");
    MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> b,
                        Upload(m->data, m->n_bytes, "a dense weight " + ShapeToString(m->shape)));
    matrices_[m->data] = DeviceMatrix{m->dtype, m->dim(0), m->dim(1), b.data()};
    memory_.push_back(std::move(b));
  }
  for (const std::vector<float>* v : vectors) {
    if (v->empty() || vectors_.count(v->data()) != 0) continue;
    MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> b,
                        Upload(v->data(), v->size() * sizeof(float), "a norm or bias vector"));
    vectors_[v->data()] = reinterpret_cast<const float*>(b.data());
    memory_.push_back(std::move(b));
  }
  return OkStatus();
}

Status DeviceWeights::AddExperts(const ExpertSource& experts, std::span<const int64_t> vram_layers,
                                 int64_t shape_layer, int64_t n_layers, int64_t n_experts) {
  n_experts_ = n_experts;
  if (shape_layer < 0 || n_experts == 0) return OkStatus();
  const ExpertWeights& e0 = experts.Expert(shape_layer, 0);
  const DType computed = GpuExpertDType(e0.gate.dtype);  // a BF16C bank is expanded to bf16
  if (computed != DType::kBF16 && computed != DType::kQ8_0 && computed != DType::kQ4_0)
    return Status::Error("experts of dtype " + std::string(DTypeName(e0.gate.dtype)) +
                         " cannot run on the GPU (bf16, q8_0 or q4_0 only)");
  expert_shape_ = ExpertShape{computed, e0.gate.dim(1), e0.gate.dim(0)};
  std::vector<ExpertPointers> table(static_cast<size_t>(n_layers * n_experts));
  for (int64_t layer : vram_layers) {
    if (experts.Expert(layer, 0).gate.dtype != computed)
      return Status::Error("the experts of layer " + std::to_string(layer) + " are " +
                           std::string(DTypeName(experts.Expert(layer, 0).gate.dtype)) +
                           ": VRAM holds bf16, q8_0 or q4_0 banks as they are stored");
    const uint64_t expert_bytes = e0.gate.n_bytes + e0.up.n_bytes + e0.down.n_bytes;
    const std::string what = "the experts of layer " + std::to_string(layer);
    MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> bank,
                        DeviceBuffer<uint8_t>::Create(expert_bytes * n_experts, what));
    for (int64_t e = 0; e < n_experts; ++e) {
      const ExpertWeights& w = experts.Expert(layer, e);
      uint8_t* at = bank.data() + static_cast<uint64_t>(e) * expert_bytes;
      ExpertPointers& p = table[static_cast<size_t>(layer * n_experts + e)];
      p.gate = at;
      p.up = at + w.gate.n_bytes;
      p.down = at + w.gate.n_bytes + w.up.n_bytes;
      for (const auto& [dst, src] :
           {std::pair{p.gate, &w.gate}, std::pair{p.up, &w.up}, std::pair{p.down, &w.down}})
        MT_CUDA_RETURN_IF_ERROR(
            cudaMemcpy(const_cast<void*>(dst), src->data, src->n_bytes, cudaMemcpyHostToDevice),
            "copying " + what + " to the GPU");
    }
    bytes_ += bank.bytes();
    memory_.push_back(std::move(bank));
  }
  MT_ASSIGN_OR_RETURN(table_,
                      DeviceBuffer<ExpertPointers>::Create(table.size(), "the expert table"));
  MT_CUDA_RETURN_IF_ERROR(cudaMemcpy(table_.data(), table.data(),
                                     table.size() * sizeof(ExpertPointers), cudaMemcpyHostToDevice),
                          "copying the expert table to the GPU");
  return OkStatus();
}

DeviceMatrix DeviceWeights::Matrix(const TensorView& host) const {
  return matrices_.at(host.data);
}

const float* DeviceWeights::Vector(const std::vector<float>& host) const {
  if (host.empty()) return nullptr;
  return vectors_.at(host.data());
}

}  // namespace moetier::cuda
