// Who holds which block of the KV pool (backend/kv_cache.h), and the prefix cache.
//
// Blocks are reference-counted: a sequence holds one reference to each block of its table.
// A full block whose K/V have been computed can be registered under the hash of every token up
// to its end (a chain: the hash of the block's tokens seeded with the previous block's hash);
// a later sequence whose tokens start the same way takes those blocks instead of recomputing
// them. A registered block is immutable: a sequence that must write into one (it re-runs the
// block's last position to get logits) copies it first (copy-on-write). When its last
// reference goes, a registered block stays cached, least recently used first out, until its
// space is needed; an unregistered one is free at once.
//
// Every operation is O(1) or O(tokens) and allocates nothing after construction: the hash table
// is open-addressed over a fixed array and the cache's LRU list is intrusive.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace moetier {

class KvBlocks {
 public:
  KvBlocks(int64_t n_blocks, int64_t block_size);

  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks an Allocate can return now: free ones plus cached ones nobody holds.
  int64_t n_available() const { return n_free_ + n_cached_idle_; }
  int64_t n_cached() const { return n_registered_; }
  // Blocks ever handed out: the pool's memory is touched (host RAM resident) up to this many,
  // and it grows until every block has been (free blocks are reused last in, first out).
  int64_t n_touched() const { return n_blocks() - min_free_; }

  // A block with one reference: a free one, else the least recently used cached one (which
  // leaves the cache). -1 when every block is held.
  int32_t Allocate();
  void Ref(int32_t block);
  void Unref(int32_t block);
  int32_t refs(int32_t block) const { return blocks_[static_cast<size_t>(block)].refs; }
  // Whether writing into `block` would change what another holder or the cache sees.
  bool IsShared(int32_t block) const {
    const Block& b = blocks_[static_cast<size_t>(block)];
    return b.refs > 1 || b.registered;
  }

  // The chain hash of block_size tokens following a block whose hash is `parent` (0 for the
  // first block of a sequence).
  static uint64_t ChainHash(uint64_t parent, std::span<const int32_t> block_tokens);

  // The cached blocks holding the longest prefix of `tokens` made of whole blocks, at most
  // `max_blocks` of them, each with a reference taken for the caller; appended to `blocks`, and
  // their chain hashes to `hashes`. Returns how many matched.
  int64_t Match(std::span<const int32_t> tokens, int64_t max_blocks, std::vector<int32_t>& blocks,
                std::vector<uint64_t>& hashes);
  // The cached block holding `block_tokens` after a block whose hash is `parent`, with a
  // reference taken for the caller; -1 when none.
  int32_t Take(uint64_t parent, std::span<const int32_t> block_tokens);
  // Called by Allocate with each cached block it is about to reuse, its K/V still intact (the
  // host KV tier keeps a copy).
  using EvictionSink = std::function<void(int32_t block, uint64_t parent, uint64_t hash,
                                          std::span<const int32_t> block_tokens)>;
  void SetEvictionSink(EvictionSink sink) { evicted_ = std::move(sink); }

  // Registers a full, computed block under `hash` (ChainHash of its tokens after `parent`).
  // When another block already holds that hash, nothing changes (the caller keeps its copy,
  // unregistered). `tokens` are compared on every match, so a hash collision costs a miss,
  // never wrong K/V.
  void Register(int32_t block, uint64_t parent, uint64_t hash,
                std::span<const int32_t> block_tokens);

 private:
  struct Block {
    int32_t refs = 0;
    bool registered = false;
    uint64_t hash = 0, parent = 0;
    int32_t lru_prev = -1, lru_next = -1;  // in the idle cached list
  };
  static constexpr int32_t kEmpty = -1, kTombstone = -2;

  void PushIdle(int32_t block);  // most recently used end
  void RemoveIdle(int32_t block);
  void Unregister(int32_t block);
  void RebuildTable();  // drops the tombstones
  int64_t Find(uint64_t hash, uint64_t parent, std::span<const int32_t> block_tokens) const;
  const int32_t* TokensOf(int32_t block) const {
    return tokens_.data() + static_cast<size_t>(block) * static_cast<size_t>(block_size_);
  }

  int64_t block_size_;
  std::vector<Block> blocks_;
  std::vector<int32_t> tokens_;  // [n_blocks, block_size]: each registered block's tokens
  std::vector<int32_t> free_;    // unregistered blocks nobody holds (a stack)
  int64_t n_free_ = 0;
  int64_t min_free_ = 0;  // n_free_'s low-water mark: the bottom of free_ never handed out
  int32_t idle_head_ = -1, idle_tail_ = -1;  // registered, unheld; head = least recently used
  int64_t n_cached_idle_ = 0;
  int64_t n_registered_ = 0;
  std::vector<int32_t> table_;  // open addressing: hash slots -> block, kEmpty or kTombstone
  int64_t n_tombstones_ = 0;
  EvictionSink evicted_;
};

}  // namespace moetier
