#include "engine/kv_blocks.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cstring>

namespace moetier {

KvBlocks::KvBlocks(int64_t n_blocks, int64_t block_size)
    : block_size_(block_size),
      blocks_(static_cast<size_t>(n_blocks)),
      tokens_(static_cast<size_t>(n_blocks * block_size)),
      free_(static_cast<size_t>(n_blocks)),
      n_free_(n_blocks),
      min_free_(n_blocks) {
  // Highest ids on top of the stack last: blocks are handed out 0, 1, 2, ... on a fresh pool.
  for (int64_t i = 0; i < n_blocks; ++i)
    free_[static_cast<size_t>(i)] = static_cast<int32_t>(n_blocks - 1 - i);
  // At most half full, so probes stay short; a power of two, so a mask picks the slot.
  size_t slots = 16;
  while (slots < static_cast<size_t>(2 * n_blocks)) slots *= 2;
  table_.assign(slots, kEmpty);
}

uint64_t KvBlocks::ChainHash(uint64_t parent, std::span<const int32_t> block_tokens) {
  return XXH64(block_tokens.data(), block_tokens.size_bytes(), parent);
}

int32_t KvBlocks::Allocate() {
  int32_t b = -1;
  if (n_free_ > 0) {
    b = free_[static_cast<size_t>(--n_free_)];
    min_free_ = std::min(min_free_, n_free_);
  } else if (idle_head_ >= 0) {
    b = idle_head_;
    RemoveIdle(b);
    if (evicted_) {
      const Block& blk = blocks_[static_cast<size_t>(b)];
      evicted_(b, blk.parent, blk.hash,
               std::span<const int32_t>(TokensOf(b), static_cast<size_t>(block_size_)));
    }
    Unregister(b);
  } else {
    return -1;
  }
  blocks_[static_cast<size_t>(b)].refs = 1;
  return b;
}

void KvBlocks::Ref(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.refs == 0 && b.registered) RemoveIdle(block);
  ++b.refs;
}

void KvBlocks::Unref(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  assert(b.refs > 0);
  if (--b.refs > 0) return;
  if (b.registered) {
    PushIdle(block);
  } else {
    free_[static_cast<size_t>(n_free_++)] = block;
  }
}

void KvBlocks::PushIdle(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  b.lru_prev = idle_tail_;
  b.lru_next = -1;
  if (idle_tail_ >= 0) blocks_[static_cast<size_t>(idle_tail_)].lru_next = block;
  idle_tail_ = block;
  if (idle_head_ < 0) idle_head_ = block;
  ++n_cached_idle_;
}

void KvBlocks::RemoveIdle(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.lru_prev >= 0)
    blocks_[static_cast<size_t>(b.lru_prev)].lru_next = b.lru_next;
  else
    idle_head_ = b.lru_next;
  if (b.lru_next >= 0)
    blocks_[static_cast<size_t>(b.lru_next)].lru_prev = b.lru_prev;
  else
    idle_tail_ = b.lru_prev;
  b.lru_prev = b.lru_next = -1;
  --n_cached_idle_;
}

int64_t KvBlocks::Find(uint64_t hash, uint64_t parent,
                       std::span<const int32_t> block_tokens) const {
  const size_t mask = table_.size() - 1;
  for (size_t i = hash & mask, probes = 0; probes < table_.size(); i = (i + 1) & mask, ++probes) {
    const int32_t b = table_[i];
    if (b == kEmpty) return -1;
    if (b == kTombstone) continue;
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.hash == hash && blk.parent == parent &&
        std::memcmp(TokensOf(b), block_tokens.data(), block_tokens.size_bytes()) == 0)
      return static_cast<int64_t>(i);
  }
  return -1;
}

void KvBlocks::Unregister(int32_t block) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (!b.registered) return;
  const int64_t slot =
      Find(b.hash, b.parent,
           std::span<const int32_t>(TokensOf(block), static_cast<size_t>(block_size_)));
  if (slot >= 0) table_[static_cast<size_t>(slot)] = kTombstone;
  b.registered = false;
  --n_registered_;
  // Misses probe past tombstones up to the next empty slot: past a quarter of the table,
  // start it afresh from the live entries.
  if (++n_tombstones_ > static_cast<int64_t>(table_.size() / 4)) RebuildTable();
}

void KvBlocks::RebuildTable() {
  std::fill(table_.begin(), table_.end(), kEmpty);
  n_tombstones_ = 0;
  const size_t mask = table_.size() - 1;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (!blocks_[b].registered) continue;
    size_t i = blocks_[b].hash & mask;
    while (table_[i] >= 0) i = (i + 1) & mask;
    table_[i] = static_cast<int32_t>(b);
  }
}

void KvBlocks::Register(int32_t block, uint64_t parent, uint64_t hash,
                        std::span<const int32_t> block_tokens) {
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.registered || Find(hash, parent, block_tokens) >= 0) return;
  // Tombstones accumulate as blocks are evicted; the table stays at most half full of live
  // entries, so a slot is always found.
  const size_t mask = table_.size() - 1;
  size_t i = hash & mask;
  while (table_[i] >= 0) i = (i + 1) & mask;
  if (table_[i] == kTombstone) --n_tombstones_;
  table_[i] = block;
  std::copy(block_tokens.begin(), block_tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(block) * block_size_);
  b.registered = true;
  b.hash = hash;
  b.parent = parent;
  ++n_registered_;
}

int32_t KvBlocks::Take(uint64_t parent, std::span<const int32_t> block_tokens) {
  const int64_t slot = Find(ChainHash(parent, block_tokens), parent, block_tokens);
  if (slot < 0) return -1;
  const int32_t b = table_[static_cast<size_t>(slot)];
  Ref(b);
  return b;
}

int64_t KvBlocks::Match(std::span<const int32_t> tokens, int64_t max_blocks,
                        std::vector<int32_t>& blocks, std::vector<uint64_t>& hashes) {
  uint64_t parent = 0;
  const int64_t whole =
      std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size_);
  int64_t k = 0;
  for (; k < whole; ++k) {
    const auto block_tokens =
        tokens.subspan(static_cast<size_t>(k * block_size_), static_cast<size_t>(block_size_));
    const uint64_t hash = ChainHash(parent, block_tokens);
    const int64_t slot = Find(hash, parent, block_tokens);
    if (slot < 0) break;
    const int32_t b = table_[static_cast<size_t>(slot)];
    Ref(b);
    blocks.push_back(b);
    hashes.push_back(hash);
    parent = hash;
  }
  return k;
}

}  // namespace moetier
