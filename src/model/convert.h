// moetier convert: a Hugging Face checkpoint → the bank format (DESIGN.md "Bank format"). Streams
// layer by layer from the checkpoint's memory maps to the output files, so peak memory is a
// few layers of page cache, not the model.
#pragma once

#include <cstdint>
#include <filesystem>

#include "core/status.h"

namespace moetier {

struct ConvertOptions {
  uint64_t shard_bytes = 8ull << 30;  // start a new data file past this size (--shard-gib)
  bool overwrite = false;             // replace a previous conversion in the output directory
};

struct ConvertSummary {
  uint64_t bytes_written = 0;
  int n_files = 0;
  int n_banks = 0;
  int n_tensors = 0;
};

Expected<ConvertSummary> ConvertCheckpoint(const std::filesystem::path& hf_dir,
                                           const std::filesystem::path& out_dir,
                                           const ConvertOptions& options);

}  // namespace moetier
