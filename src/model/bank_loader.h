// Fills one host bank per MoE layer — as stored, or packed where the plan says (a CPU tier's
// bf16 experts as bf16c) — and settles each to its planned tier (degrading where a pin or lock
// fails); a pinned layer the plan gives a CPU copy (hybrid) gets a second, packed bank, locked.
// A converted model's banks are read as one O_DIRECT stream over all layers; settling — checksum,
// packing, cudaHostRegister or mlock — runs on a second thread while the next layers are read,
// so it overlaps the reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "experts/banked_experts.h"
#include "experts/residency_plan.h"
#include "experts/settle.h"
#include "io/direct_read.h"
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
  FailureInjection inject;  // MOETIER_INJECT_FAILURES (tests of the degrade paths)
  size_t read_chunk_bytes = kDirectReadChunkBytes;  // per read call (MOETIER_IO_CHUNK_MIB)
};

// `io_pool` reads (or copies) each bank with several threads; `pack_pool` packs the banks the
// plan holds in another format than stored (a plan layer's dtype differs from the source's).
Expected<LoadedBanks> LoadBanks(const ModelSource& source, const ResidencyPlan& plan,
                                const BankLoadOptions& options, ThreadPool& io_pool,
                                ThreadPool& pack_pool);

}  // namespace moetier
