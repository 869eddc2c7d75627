// HostBank: the host buffer holding one MoE layer's experts, expert after expert. Owned and
// move-only. It is allocated pageable, filled, then settled once to its tier:
//   pinned   — cudaHostRegister after the fill (never before: the driver would fault in and
//              zero every page a second time), device pointer recorded;
//   locked   — mlock of exactly the bank's byte length (not the page-rounded allocation);
//   pageable — left as is.
// The destructor undoes whichever happened (unregister / unlock) and frees the memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "experts/tier.h"

namespace moetier {

// Every bank's start and allocated length are multiples of this, for O_DIRECT reads and so one
// expert or one layer is one DMA-able, lockable region.
inline constexpr size_t kBankAlignment = 4096;

inline constexpr size_t AlignUp(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

class HostBank {
 public:
  // An uninitialised pageable buffer of n_bytes (allocation rounded up to kBankAlignment).
  static Expected<HostBank> Allocate(size_t n_bytes);

  HostBank() = default;
  ~HostBank();
  HostBank(HostBank&& other) noexcept;
  HostBank& operator=(HostBank&& other) noexcept;
  HostBank(const HostBank&) = delete;
  HostBank& operator=(const HostBank&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return n_bytes_; }                // the bank's bytes
  size_t allocated_size() const { return alloc_bytes_; }  // rounded to kBankAlignment
  Tier tier() const { return tier_; }
  // The device address of data() when pinned, else nullptr.
  const void* device_ptr() const { return device_ptr_; }

  // Settling: each is tried once, on a pageable bank; on failure the bank stays pageable and
  // the Status says why.
  Status Pin();
  Status Lock();

 private:
  void Release();
  uint8_t* data_ = nullptr;
  size_t n_bytes_ = 0;
  size_t alloc_bytes_ = 0;
  Tier tier_ = Tier::kPageable;
  void* device_ptr_ = nullptr;
};

}  // namespace moetier
