// The key/value cache, paged: one pool of fixed-size blocks that every sequence draws from, and
// per sequence a block table (its blocks in position order). Position p of a sequence lives in
// slot p % block_size of block table[p / block_size]. Which blocks a sequence owns, and which
// it shares with others (a common prefix), is the engine's business (engine/kv_blocks.h); this
// file only stores rows and says where they are.
//
// Layout: block b, layer l holds K [block_size, n_kv_heads * head_dim] then V of the same shape,
// in the pool's dtype (f32, the default, exact; bf16 or f16 halve the bytes). The bytes are a
// KvMemory: by default one anonymous host mapping reserved at creation (pages cost RAM only once
// a block is written, so a pool sized for many long sequences costs what the sequences use); a
// GPU backend gives device memory instead (ComputeBackend::AllocateKv), which only its kernels
// read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace moetier {

struct KvShape {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t row() const { return n_kv_heads * head_dim; }  // elements per position per layer
};

// --kv-dtype: f32 (exact), bf16 or f16.
Expected<DType> ParseKvDType(std::string_view text);

// Where a pool's bytes are. Owned by the pool; move-only through it.
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  virtual uint8_t* data() const = 0;
  // Whether the CPU may read and write data() (the host mapping), or only a device's kernels.
  virtual bool on_host() const = 0;
  // Copies n bytes from offset src to offset dst (ranges do not overlap), ordered after every
  // write to the pool queued before it.
  virtual void Copy(uint64_t dst, uint64_t src, uint64_t n) = 0;
  // Copies n bytes at offset src out to host memory, or host memory in at offset dst: after
  // every write queued before, and complete when the call returns. False when a device failed.
  virtual bool ToHost(uint64_t src, uint64_t n, void* dst) = 0;
  virtual bool FromHost(uint64_t dst, const void* src, uint64_t n) = 0;
};

// Host memory: an anonymous mapping of n_bytes, reserved (not committed) until written.
Expected<std::unique_ptr<KvMemory>> AllocateHostKv(uint64_t n_bytes);

// Gives a pool of n_bytes its memory.
using KvAllocator = std::function<Expected<std::unique_ptr<KvMemory>>(uint64_t n_bytes)>;

class KvPool {
 public:
  // Positions per block: small enough that a shared prefix is reused to within 15 tokens and a
  // sequence wastes at most 15 positions; large enough that attention reads runs of rows.
  static constexpr int64_t kDefaultBlockSize = 16;

  // The pool's memory from `allocate` (null: host memory, AllocateHostKv).
  static Expected<KvPool> Create(const KvShape& shape, int64_t n_blocks,
                                 int64_t block_size = kDefaultBlockSize, DType dtype = DType::kF32,
                                 const KvAllocator& allocate = nullptr);
  // Bytes one block takes over all layers (K and V).
  static uint64_t BlockBytes(const KvShape& shape, int64_t block_size, DType dtype);

  KvPool() = default;

  const KvShape& shape() const { return shape_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  DType dtype() const { return dtype_; }
  uint64_t bytes() const { return bytes_; }
  // Whether keys()/values()/WriteRows may be used from the CPU (else the memory is a device's).
  bool on_host() const { return memory_ != nullptr && memory_->on_host(); }
  // The first byte of block 0, layer 0's keys: where a device backend's kernels start.
  uint8_t* base() const { return memory_ != nullptr ? memory_->data() : nullptr; }

  // The K (or V) rows [block_size, row] of `block` in `layer`, in dtype().
  uint8_t* keys(int64_t block, int64_t layer) { return Rows(block, layer, 0); }
  uint8_t* values(int64_t block, int64_t layer) { return Rows(block, layer, 1); }
  const uint8_t* keys(int64_t block, int64_t layer) const { return Rows(block, layer, 0); }
  const uint8_t* values(int64_t block, int64_t layer) const { return Rows(block, layer, 1); }

  // Stores float32 rows [n, row] at slots [slot, slot + n) of block's K or V in `layer`,
  // converted to dtype() (round to nearest even). Host memory only.
  void WriteRows(int64_t block, int64_t layer, int64_t slot, int64_t n, const float* k,
                 const float* v);
  // Copies every layer's rows of `src` to `dst` (copy-on-write of a shared block).
  void CopyBlock(int64_t src, int64_t dst);
  // A block's rows of every layer (block_bytes() of them) out to host memory, or in from it
  // (the engine's host KV tier). False when a device failed.
  uint64_t block_bytes() const { return plane_bytes_ * static_cast<uint64_t>(2 * shape_.n_layers); }
  bool SaveBlock(int64_t block, uint8_t* dst) const;
  bool LoadBlock(int64_t block, const uint8_t* src);

 private:
  uint8_t* Rows(int64_t block, int64_t layer, int kv) const;

  KvShape shape_;
  int64_t n_blocks_ = 0;
  int64_t block_size_ = kDefaultBlockSize;
  DType dtype_ = DType::kF32;
  uint64_t plane_bytes_ = 0;  // one layer's K (or V) rows of one block
  uint64_t bytes_ = 0;
  std::unique_ptr<KvMemory> memory_;
};

// The cache of one sequence on a pool of its own, its blocks in order: what a single-sequence
// client (tests, `logits`, a bench) uses with CausalLM::Forward(tokens, cache, ...). Many
// sequences share one pool through the engine instead.
class KvCache {
 public:
  KvCache() = default;
  // Reserves max_positions positions (address space only until written).
  static Expected<KvCache> Create(const KvShape& shape, int64_t max_positions,
                                  DType dtype = DType::kF32, const KvAllocator& allocate = nullptr);

  int64_t n_past() const { return n_past_; }
  int64_t max_positions() const { return max_positions_; }

  // Fails (naming the limit) when n_past() + n_new positions exceed max_positions().
  Status Reserve(int64_t n_new) const;
  // Marks n_new positions (whose K/V the layers wrote) as part of the sequence.
  void Advance(int64_t n_new) { n_past_ += n_new; }

  KvPool& pool() { return pool_; }
  std::span<const int32_t> blocks() const { return blocks_; }

 private:
  KvPool pool_;
  std::vector<int32_t> blocks_;  // 0, 1, 2, ...: the pool is this sequence's alone
  int64_t max_positions_ = 0;
  int64_t n_past_ = 0;
};

}  // namespace moetier
