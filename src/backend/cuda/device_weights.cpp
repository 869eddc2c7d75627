#include "backend/cuda/device_weights.h"

#include <string>

#include "kernels/cuda/bf16c_expand.h"

namespace moetier::cuda {

namespace {

// Whether the GPU computes matrices held as `d` (BF16C: expanded to bf16 at upload).
bool GpuReads(DType d) {
  const DType c = GpuDType(d);
  return c == DType::kF32 || c == DType::kF16 || c == DType::kBF16 || c == DType::kQ8_0 ||
         c == DType::kQ4_0;
}

// Bytes of `m` as the GPU holds it.
uint64_t GpuBytes(const TensorView& m) {
  return static_cast<uint64_t>(m.dim(0)) * DTypeRowBytes(GpuDType(m.dtype), m.dim(1));
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
                           " cannot run on the GPU (2-D f32, f16, bf16, bf16c, q8_0 or q4_0 only)");
    const std::string what = "a dense weight " + ShapeToString(m->shape);
    MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> b, DeviceBuffer<uint8_t>::Create(GpuBytes(*m), what));
    MT_RETURN_IF_ERROR(CopyMatrix(*m, b.data(), what));
    bytes_ += b.bytes();
    matrices_[m->data] = DeviceMatrix{GpuDType(m->dtype), m->dim(0), m->dim(1), b.data()};
    memory_.push_back(std::move(b));
  }
  MT_RETURN_IF_ERROR(FinishExpansions());
  for (const std::vector<float>* v : vectors) {
    if (v->empty() || vectors_.count(v->data()) != 0) continue;
    MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> b,
                        Upload(v->data(), v->size() * sizeof(float), "a norm or bias vector"));
    vectors_[v->data()] = reinterpret_cast<const float*>(b.data());
    memory_.push_back(std::move(b));
  }
  return OkStatus();
}

Status DeviceWeights::CopyMatrix(const TensorView& m, void* dst, const std::string& what) {
  if (m.dtype != DType::kBF16C) {
    MT_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, m.data, m.n_bytes, cudaMemcpyHostToDevice),
                            "copying " + what + " to the GPU");
    return OkStatus();
  }
  if (scratch_.bytes() < m.n_bytes) {
    scratch_ = {};
    MT_ASSIGN_OR_RETURN(scratch_, DeviceBuffer<uint8_t>::Create(m.n_bytes, what + ", packed"));
  }
  // The legacy default stream orders this copy after the expansion of the last matrix (the
  // scratch's last reader), and that expansion after its copy.
  MT_CUDA_RETURN_IF_ERROR(cudaMemcpy(scratch_.data(), m.data, m.n_bytes, cudaMemcpyHostToDevice),
                          "copying " + what + " to the GPU");
  const Bf16cRows rows{scratch_.data(), static_cast<uint8_t*>(dst), m.dim(0), m.dim(1)};
  LaunchExpandBf16cRows(std::span(&rows, 1), nullptr);
  MT_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "expanding " + what + " on the GPU");
  return OkStatus();
}

Status DeviceWeights::FinishExpansions() {
  if (scratch_.bytes() == 0) return OkStatus();
  scratch_ = {};
  // The expansions ran on the legacy default stream, which the backend's streams do not wait
  // for.
  MT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "expanding packed weights on the GPU");
  return OkStatus();
}

Status DeviceWeights::AddExperts(const ExpertSource& experts, std::span<const int64_t> vram_layers,
                                 int64_t shape_layer, int64_t n_layers, int64_t n_experts) {
  n_experts_ = n_experts;
  if (shape_layer < 0 || n_experts == 0) return OkStatus();
  const ExpertWeights& e0 = experts.Expert(shape_layer, 0);
  const DType computed = GpuDType(e0.gate.dtype);  // a BF16C bank is expanded to bf16
  if (computed != DType::kBF16 && computed != DType::kQ8_0 && computed != DType::kQ4_0)
    return Status::Error("experts of dtype " + std::string(DTypeName(e0.gate.dtype)) +
                         " cannot run on the GPU (bf16, bf16c, q8_0 or q4_0 only)");
  expert_shape_ = ExpertShape{computed, e0.gate.dim(1), e0.gate.dim(0)};
  const uint64_t gate_bytes = GpuBytes(e0.gate), down_bytes = GpuBytes(e0.down);
  const uint64_t expert_bytes = 2 * gate_bytes + down_bytes;
  std::vector<ExpertPointers> table(static_cast<size_t>(n_layers * n_experts));
  for (int64_t layer : vram_layers) {
    const std::string what = "the experts of layer " + std::to_string(layer);
    MT_ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> bank,
                        DeviceBuffer<uint8_t>::Create(expert_bytes * n_experts, what));
    for (int64_t e = 0; e < n_experts; ++e) {
      const ExpertWeights& w = experts.Expert(layer, e);
      if (GpuDType(w.gate.dtype) != computed || w.gate.shape != e0.gate.shape ||
          w.down.shape != e0.down.shape)
        return Status::Error(what + " differ in dtype or shape from layer " +
                             std::to_string(shape_layer) + "'s");
      uint8_t* at = bank.data() + static_cast<uint64_t>(e) * expert_bytes;
      ExpertPointers& p = table[static_cast<size_t>(layer * n_experts + e)];
      p.gate = at;
      p.up = at + gate_bytes;
      p.down = at + 2 * gate_bytes;
      for (const auto& [dst, src] :
           {std::pair{p.gate, &w.gate}, std::pair{p.up, &w.up}, std::pair{p.down, &w.down}})
        MT_RETURN_IF_ERROR(CopyMatrix(*src, const_cast<void*>(dst), what));
    }
    bytes_ += bank.bytes();
    memory_.push_back(std::move(bank));
  }
  MT_RETURN_IF_ERROR(FinishExpansions());
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
