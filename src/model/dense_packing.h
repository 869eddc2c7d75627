// Dense-weight packing at load: the dense matrices the CPU computes with (attention, dense MLPs,
// the embedding and lm_head) served packed as BF16C (experts/weight_packing.h), the same values
// in fewer bytes. The routers stay as stored (as `moetier convert --dense-dtype` leaves them).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "experts/weight_packing.h"
#include "io/tensor_store.h"

namespace moetier {

struct DensePacking {
  std::unique_ptr<TensorStore> store;  // serves the packed matrices, the rest from the input
  int n_packed = 0;
  uint64_t bytes_before = 0, bytes_after = 0;  // of the packed matrices
  std::vector<std::string> warnings;           // matrices with a row that does not pack
};

// Packs every 2-D matrix of `dense` that CpuMatrixDType turns into BF16C, but those named in
// `keep`, with `pool`; a matrix with a row that does not pack stays as stored, with a warning.
// The packed copies live in anonymous memory owned by the returned store.
Expected<DensePacking> PackDenseWeights(std::unique_ptr<TensorStore> dense,
                                        const std::set<std::string>& keep, WeightPacking packing,
                                        ThreadPool& pool);

}  // namespace moetier
