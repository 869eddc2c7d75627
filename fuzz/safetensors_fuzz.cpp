// Fuzzes the safetensors header parser: any bytes must give a header or an error, never a
// crash, a hang or an out-of-bounds read; an accepted header's tensors must tile the data
// section exactly (no hole, no overlap, nothing trailing).
#include <cstdint>
#include <cstdlib>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto h = moetier::ParseSafetensorsHeader(data, size);
  if (h.ok()) {
    uint64_t covered = 0;
    for (const auto& t : h->tensors) {
      if (h->data_start + t.end > size || t.begin > t.end || t.begin != covered) std::abort();
      covered = t.end;
      // Touch the first and last byte so ASan checks the ranges the parser accepted.
      if (t.end > t.begin) {
        volatile uint8_t a = data[h->data_start + t.begin];
        volatile uint8_t b = data[h->data_start + t.end - 1];
        (void)a;
        (void)b;
      }
    }
    if (h->data_start + covered != size) std::abort();
  }
  return 0;
}
