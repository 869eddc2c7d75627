// How the dense weights are held for the CPU (cpu backend): the matrices it streams every token
// (attention, dense MLPs, routers, the lm_head) are served from anonymous memory rather than
// from the file mapping, packed as BF16C where experts/weight_packing.h says so, else copied as
// stored.
//
// Why copy what is already mapped: on a dev VM the very same matrices streamed up to 1.5x faster
// from an anonymous copy than from the model file's mapping, and a decoded token ran 5-16 %
// faster (docs/benchmarks.md, "settings"); why the mapping streams slower there is not known.
// The copy costs RAM (the file's cached pages stay, but the kernel may reclaim them) and a
// memcpy at load.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "experts/weight_packing.h"
#include "io/tensor_store.h"

namespace moetier {

enum class DenseMemory {
  kAuto,    // copy when RAM allows (CopiesDense), the default
  kCopy,    // copy whatever it costs
  kMapped,  // read every matrix not packed from the file mapping
};

// Parses --dense-memory (auto | copy | mapped); the error names the flag.
Expected<DenseMemory> ParseDenseMemory(const std::string& text);
std::string_view DenseMemoryName(DenseMemory m);

// RAM that must stay available after the copy for `auto` to make it: the lock budget's own
// margin (experts/budgets.h), so that copying never eats what the OS and the KV cache need.
inline constexpr uint64_t kDenseCopyMinFreeBytes = 2ull << 30;

// The heuristic: whether the dense matrices not packed, `copy_bytes` of them, are copied to
// anonymous memory when `available_bytes` of RAM are available (MemAvailable). kAuto: when
// at least kDenseCopyMinFreeBytes remain afterwards; kCopy: always; kMapped: never.
bool CopiesDense(DenseMemory m, uint64_t copy_bytes, uint64_t available_bytes);

struct DenseHoldingOptions {
  WeightPacking packing = WeightPacking::kAuto;
  DenseMemory memory = DenseMemory::kAuto;
  uint64_t available_bytes = 0;  // RAM available now (for kAuto)
  // Left as they are (a checkpoint's expert tensors: their banks hold them).
  std::set<std::string> skip;
  // Copied but never packed (the routers, which convert also keeps in their source dtype).
  std::set<std::string> keep_dtype;
  // Packed like any matrix but never copied as stored: a token reads one row of them (an
  // embedding table not tied to the lm_head).
  std::set<std::string> gathered;
};

struct DenseHolding {
  std::unique_ptr<TensorStore> store;  // serves the held matrices, the rest from the input
  bool copies = false;                 // CopiesDense's answer
  int n_packed = 0, n_copied = 0;
  uint64_t bytes_before = 0, bytes_after = 0;  // of the packed matrices, stored and packed
  uint64_t copied_bytes = 0;                   // of the copied ones
  std::vector<std::string> warnings;           // matrices with a row that does not pack
};

// Holds every 2-D matrix of `dense` but those in `o.skip`: packed as BF16C where CpuMatrixDType
// says so (a matrix with a row that does not pack stays as stored, with a warning), else copied
// when CopiesDense says so. `pool` does the work; the held bytes live in anonymous memory owned
// by the returned store.
Expected<DenseHolding> HoldDenseWeights(std::unique_ptr<TensorStore> dense,
                                        const DenseHoldingOptions& o, ThreadPool& pool);

}  // namespace moetier
