// The host KV tier (--kv-host-gb): blocks of the prefix cache that the KV pool evicts are
// copied to host RAM instead of dropped, and a later prompt that starts with their tokens gets
// them copied back into the pool instead of recomputed. With the pool in VRAM this keeps far
// more reusable prefixes than VRAM holds; on the CPU it extends the pool's prefix cache.
//
// The tier is a set of block-sized slots in one host buffer (pages touched only as slots fill)
// whose bookkeeping is a KvBlocks of its own: the same chain hashes and token checks, least
// recently used out when full.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "backend/kv_cache.h"
#include "engine/kv_blocks.h"

namespace moetier {

class HostKvTier {
 public:
  // n_slots blocks of block_bytes (KvPool::block_bytes) for blocks of block_size positions;
  // null when the host cannot give that much address space.
  static std::unique_ptr<HostKvTier> Create(int64_t n_slots, int64_t block_size,
                                            uint64_t block_bytes);

  // Keeps a copy of pool block `block`, registered under (parent, hash, block_tokens), in place
  // of the least recently used slot when full. Nothing when it is held already.
  void Keep(const KvPool& pool, int32_t block, uint64_t parent, uint64_t hash,
            std::span<const int32_t> block_tokens);
  // The slot holding (parent, block_tokens), reserved until Release; -1 when none.
  int32_t Take(uint64_t parent, std::span<const int32_t> block_tokens) {
    return slots_.Take(parent, block_tokens);
  }
  // Copies a taken slot into pool block `into`; false when the copy failed.
  bool CopyInto(int32_t slot, KvPool& pool, int32_t into) const;
  void Release(int32_t slot) { slots_.Unref(slot); }

  int64_t n_slots() const { return slots_.n_blocks(); }
  int64_t n_held() const { return slots_.n_cached(); }
  uint64_t block_bytes() const { return block_bytes_; }

 private:
  HostKvTier(int64_t n_slots, int64_t block_size, uint64_t block_bytes,
             std::unique_ptr<uint8_t[]> data);
  uint8_t* Slot(int32_t slot) const {
    return data_.get() + static_cast<uint64_t>(slot) * block_bytes_;
  }

  KvBlocks slots_;
  uint64_t block_bytes_;
  std::unique_ptr<uint8_t[]> data_;  // [n_slots, block_bytes], not initialized
};

}  // namespace moetier
