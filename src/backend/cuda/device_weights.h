// The model's weights in VRAM: every dense matrix and vector the decoder holds (copied once at
// load, found again by the host address of the view the decoder passes), and every routed expert
// of every MoE layer (one allocation a layer, experts back to back, with a device table of each
// expert's gate/up/down addresses that the expert kernels read). Matrices held as BF16C are
// expanded to bf16 on the way.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/expert_ffn.h"
#include "ops/expert_source.h"

namespace moetier::cuda {

class DeviceWeights {
 public:
  // Copies each matrix and vector (once, however often it is listed: a tied lm_head).
  Status AddDense(std::span<const TensorView* const> matrices,
                  std::span<const std::vector<float>* const> vectors);
  // The experts the GPU computes: their shape and dtype from layer `shape_layer` (-1: the GPU
  // computes none), every expert of `vram_layers` copied from `experts` (n_experts each), and
  // the table of every layer (the others' entries are the expert cache's to fill).
  Status AddExperts(const ExpertSource& experts, std::span<const int64_t> vram_layers,
                    int64_t shape_layer, int64_t n_layers, int64_t n_experts);

  // The device copy of a matrix or vector handed to AddDense (by its host address).
  DeviceMatrix Matrix(const TensorView& host) const;
  // nullptr for an empty vector.
  const float* Vector(const std::vector<float>& host) const;
  // The table [n_experts] of MoE layer `layer`'s experts (device memory).
  ExpertPointers* ExpertTable(int64_t layer) const { return table_.data() + layer * n_experts_; }
  ExpertShape expert_shape() const { return expert_shape_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Expected<DeviceBuffer<uint8_t>> Upload(const void* host, size_t n_bytes, const std::string& what);
  // Copies host matrix `m` to dst as the GPU holds it: as stored, or BF16C through scratch_ and
  // expanded to bf16 (kernels/cuda/bf16c_expand.h).
  Status CopyMatrix(const TensorView& m, void* dst, const std::string& what);
  // Waits for the expansions CopyMatrix queued and frees scratch_.
  Status FinishExpansions();
  DeviceBuffer<uint8_t> scratch_;  // a packed matrix on its way (freed after each Add*)
  std::unordered_map<const void*, DeviceMatrix> matrices_;
  std::unordered_map<const float*, const float*> vectors_;
  std::vector<DeviceBuffer<uint8_t>> memory_;  // owns every copy above and the expert banks
  DeviceBuffer<ExpertPointers> table_;         // [n_layers * n_experts]
  int64_t n_experts_ = 0;
  ExpertShape expert_shape_;
  uint64_t bytes_ = 0;
};

}  // namespace moetier::cuda
