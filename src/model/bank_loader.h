// Fills one host bank per MoE layer and settles each to its planned tier (degrading where a pin
// or lock fails). Settling — checksum, cudaHostRegister or mlock — runs on a second thread while
// the next layer is read, so it overlaps the reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "experts/banked_experts.h"
#include "experts/residency_plan.h"
#include "model/model_source.h"

namespace moetier {

struct LoadedBanks {
  std::unique_ptr<BankedExperts> experts;
  std::vector<LayerResidency> settled;
  std::vector<std::string> warnings;
  std::string read_mode;  // "o_direct", "buffered" (converted) or "mmap" (Hugging Face)
};

struct BankLoadOptions {
  bool verify = true;  // compare each converted bank's xxh64 with the index
  bool gpu_available = false;
};

// `io_pool` reads (or copies) each bank with several threads.
Expected<LoadedBanks> LoadBanks(const ModelSource& source, const ResidencyPlan& plan,
                                const BankLoadOptions& options, ThreadPool& io_pool);

}  // namespace moetier
