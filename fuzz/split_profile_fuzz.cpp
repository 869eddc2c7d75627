// Fuzzes the hybrid split's kept rates (hybrid-split.json): any text gives rates, none, or an
// error, never a crash; accepted rates are positive.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "experts/split_profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* key : {"NVIDIA H200 | Q4_0 | 1769472 B/expert | 16 threads", "k"}) {
    auto r = moetier::ParseSplitRates(text, key, "fuzz");
    if (r.ok() && *r && (!((*r)->copy_ns_per_expert > 0) || !((*r)->cpu_ns_per_expert > 0)))
      std::abort();
  }
  return 0;
}
