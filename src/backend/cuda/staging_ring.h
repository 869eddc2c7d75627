// StagingRing: copies host bytes that CUDA cannot DMA from directly (mlock'ed or plain pageable
// memory, not registered with cudaHostRegister) to device memory through a few pinned chunks, at
// close to the copy engine's speed. A cudaMemcpyAsync from pageable memory is staged by the
// driver through its own small pinned buffer, one piece at a time, and blocks the host while it
// does (a fraction of the pinned rate); here CPU threads memcpy the next piece of the source into
// a free chunk while the copy engine streams the previously filled chunk to the device.
//
// Pipeline, per chunk: wait until the chunk's previous DMA has finished reading it (its event) →
// memcpy its pieces into it (spread over the pool's threads) → one cudaMemcpyAsync per run of
// pieces whose device addresses are contiguous → an event recorded after them. The chunks are
// used in turn, across calls, so the DMA of chunk k overlaps the memcpy into chunk k+1; with
// more chunks the host runs further ahead of a copy engine that is busy with earlier work.
//
// Cost: every byte crosses host memory twice more than a pinned copy (read from the source,
// written to the chunk, then read by the DMA), and each chunk costs one pool hand-off, one event
// and one cudaMemcpyAsync per contiguous device run (a few µs each: many small ranges with
// scattered device addresses are bound by that, not by bandwidth).
//
// Contract: not thread-safe; Copy is called from one thread at a time, and `pool` (when given)
// must not be running another job meanwhile (ThreadPool's own contract). Copy returns once every
// byte is in a chunk and its DMA queued: the source may then be freed or changed; the
// destination must stay allocated until `stream` has run past the copy. The ring's events and
// chunks belong to the device current at Create; streams given to Copy must be of that device
// and may be destroyed before the ring (its destructor waits for the DMAs it queued).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/pinned_buffer.h"
#include "core/status.h"

namespace moetier {
class ThreadPool;
}

namespace moetier::cuda {

class StagingRing {
 public:
  struct Range {
    const void* src;  // host memory, any kind
    void* dst;        // device memory
    size_t bytes;
  };

  // Defaults: 4 chunks of 16 MiB (64 MiB pinned). A larger chunk amortizes the per-chunk costs
  // (pool hand-off, event wait, cudaMemcpyAsync: a few µs against ~300 µs to move 16 MiB at
  // ~54 GB/s) but lengthens the part of a copy that does not overlap (the first chunk's memcpy
  // and the last chunk's DMA: ~1 ms at 16 MiB) and takes more pinned memory, which is scarce.
  // Two chunks already overlap memcpy with DMA; four let the host stay ahead when the DMAs wait
  // behind other work on the stream. On an H200 host, chunks of a few MiB left the ring well
  // below the pinned rate and 16 MiB reached it with 8-16 threads; staging_bench measures this.
  // Filling a chunk takes several threads: one memcpys pageable bytes at only ~6-9 GB/s.
  static constexpr size_t kDefaultChunkBytes = size_t{16} << 20;
  static constexpr int kDefaultChunks = 4;

  // n_chunks (>= 2) pinned chunks of chunk_bytes (> 0) each, allocated once; an error naming
  // the size when the host refuses the pinned memory (or no CUDA device is present).
  static Expected<std::unique_ptr<StagingRing>> Create(size_t chunk_bytes = kDefaultChunkBytes,
                                                       int n_chunks = kDefaultChunks);
  // Waits for every DMA still reading a chunk, then frees the chunks.
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Queues the copy of every range onto `stream` through the chunks. Ranges may be of any size
  // and alignment, larger or smaller than a chunk; consecutive small ranges share a chunk, and
  // ranges whose device addresses follow one another become one DMA. Empty ranges are skipped.
  // Returns once every byte has been staged into a chunk and its DMA queued; later work on
  // `stream` sees the bytes. `pool`: threads that memcpy a chunk's bytes in parallel (null: the
  // calling thread). Errors name the range and what failed; after one, the destination's
  // bytes are undefined and the ring is usable again.
  Status Copy(std::span<const Range> ranges, cudaStream_t stream, ThreadPool* pool);

  // Blocks until every DMA queued so far has finished reading its chunk.
  Status Drain();

  size_t chunk_bytes() const { return chunk_bytes_; }
  int n_chunks() const { return n_chunks_; }

  // Since creation, for a measured cost model: bytes staged; seconds the host spent in Copy;
  // of those, seconds spent waiting for a chunk's previous DMA (the copy engine was the limit).
  uint64_t bytes_staged() const { return bytes_staged_; }
  double copy_seconds() const { return copy_seconds_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  // One piece of a range, placed in the current chunk at chunk_offset.
  struct Piece {
    const std::byte* src;
    std::byte* dst;
    size_t chunk_offset;
    size_t bytes;
    size_t range_index;  // for error messages
  };

  StagingRing(size_t chunk_bytes, int n_chunks);
  std::byte* Chunk(int i) const { return memory_.data() + static_cast<size_t>(i) * chunk_bytes_; }
  // Waits for the current chunk's previous DMA, fills it with pieces_, queues its DMAs and
  // records its event, then moves to the next chunk (also when it fails).
  Status Flush(cudaStream_t stream, ThreadPool* pool);
  Status WaitForChunk(int i);
  void Fill(ThreadPool* pool);
  Status QueueDmas(cudaStream_t stream);

  size_t chunk_bytes_;
  int n_chunks_;
  PinnedBuffer<std::byte> memory_;   // [n_chunks_ * chunk_bytes_]
  std::vector<cudaEvent_t> events_;  // per chunk: recorded after its last DMA
  std::vector<Piece> pieces_;        // what the current chunk holds, by chunk_offset
  int current_ = 0;                  // the chunk being planned
  size_t used_ = 0;                  // bytes of it that pieces_ take
  uint64_t bytes_staged_ = 0;
  double copy_seconds_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace moetier::cuda
