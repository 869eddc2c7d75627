#include "engine/host_kv_tier.h"

#include <new>
#include <utility>

namespace moetier {

std::unique_ptr<HostKvTier> HostKvTier::Create(int64_t n_slots, int64_t block_size,
                                               uint64_t block_bytes) {
  std::unique_ptr<uint8_t[]> data(new (std::nothrow)
                                      uint8_t[static_cast<uint64_t>(n_slots) * block_bytes]);
  if (data == nullptr) return nullptr;
  return std::unique_ptr<HostKvTier>(
      new HostKvTier(n_slots, block_size, block_bytes, std::move(data)));
}

HostKvTier::HostKvTier(int64_t n_slots, int64_t block_size, uint64_t block_bytes,
                       std::unique_ptr<uint8_t[]> data)
    : slots_(n_slots, block_size), block_bytes_(block_bytes), data_(std::move(data)) {}

void HostKvTier::Keep(const KvPool& pool, int32_t block, uint64_t parent, uint64_t hash,
                      std::span<const int32_t> block_tokens) {
  const int32_t held = slots_.Take(parent, block_tokens);
  if (held >= 0) {  // kept before (restored from here, say): now the most recently used
    slots_.Unref(held);
    return;
  }
  const int32_t slot = slots_.Allocate();  // every slot is idle: the least recently used goes
  if (slot < 0) return;
  if (pool.SaveBlock(block, Slot(slot))) slots_.Register(slot, parent, hash, block_tokens);
  slots_.Unref(slot);  // registered: cached, idle; else free again
}

bool HostKvTier::CopyInto(int32_t slot, KvPool& pool, int32_t into) const {
  return pool.LoadBlock(into, Slot(slot));
}

}  // namespace moetier
