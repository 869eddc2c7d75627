// What the hybrid split measured on this machine, kept between runs: per GPU, expert format and
// CPU thread count, the copy engine's and the CPU executor's time per expert as observed while
// both ran (MissSplit's averages when a run ended). A later run starts its split there instead
// of at an even guess, and refines it online from the steps it observes.
//
// One JSON file holds every key's rates: {"<key>": {"copy_ns_per_expert": x,
// "cpu_ns_per_expert": y, "split_steps": n}}. Its place: $MOETIER_CACHE_DIR, else
// $XDG_CACHE_HOME/moetier, else ~/.cache/moetier, as hybrid-split.json. A file that does not
// parse is reported (naming it) and replaced by the next save, never trusted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moetier {

struct SplitRates {
  double copy_ns_per_expert = 0;
  double cpu_ns_per_expert = 0;
  int64_t split_steps = 0;  // the steps they were averaged over (the last run's)
};

// The file, or empty when no directory is known (no HOME).
std::filesystem::path SplitProfilePath();

// "NVIDIA H200 | Q4_0 | 1769472 B/expert | 16 threads".
std::string SplitProfileKey(const std::string& gpu, const std::string& dtype, uint64_t expert_bytes,
                            int threads);

// The rates stored for `key`; nullopt when the file or the key is missing. An unreadable or
// malformed file, or rates that are not positive, is an error naming the file.
Expected<std::optional<SplitRates>> LoadSplitRates(const std::filesystem::path& file,
                                                   const std::string& key);
// The same from the file's text (`where` names it in errors).
Expected<std::optional<SplitRates>> ParseSplitRates(std::string_view text, const std::string& key,
                                                    const std::string& where);

// Stores `rates` under `key`, keeping the other keys (a malformed file is replaced); written to
// a temporary file and renamed, so a reader never sees half a file.
Status SaveSplitRates(const std::filesystem::path& file, const std::string& key,
                      const SplitRates& rates);

}  // namespace moetier
