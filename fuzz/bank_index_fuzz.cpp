// Fuzzes the converted model's index parser: any text gives an index or an error, never a crash;
// an accepted index's ranges lie inside the files it lists.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "io/bank_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto idx =
      moetier::ParseBankIndex(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (idx.ok()) {
    for (const auto& t : idx->tensors)
      if (t.offset + t.bytes > idx->files.at(t.file).bytes) std::abort();
    for (const auto& b : idx->banks)
      if (b.offset + b.bytes > idx->files.at(b.file).bytes || b.offset % 4096 != 0) std::abort();
    (void)moetier::SerializeBankIndex(*idx);
  }
  return 0;
}
