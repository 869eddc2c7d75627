#include "backend/cuda/staging_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "core/thread_pool.h"
#include "kernels/cuda/cuda_check.h"

namespace moetier::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// A thread's share of a chunk's memcpy is at least this: ~100 µs of copying at ~10 GB/s
// against a pool hand-off of a few µs. Smaller fills use fewer threads (one below 2 MiB).
constexpr size_t kMinBytesPerThread = size_t{1} << 20;
// Threads' shares start on page boundaries, so no two threads write one cache line or page.
constexpr size_t kShareAlign = 4096;

std::string DescribeBytes(size_t bytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  if (bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  return std::to_string(bytes) + " bytes";
}

// Adds the time from construction to destruction to *total (every return path of Copy).
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double* total) : total_(total), start_(Clock::now()) {}
  ~ScopedSeconds() { *total_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double* total_;
  Clock::time_point start_;
};

}  // namespace

StagingRing::StagingRing(size_t chunk_bytes, int n_chunks)
    : chunk_bytes_(chunk_bytes), n_chunks_(n_chunks) {}

Expected<std::unique_ptr<StagingRing>> StagingRing::Create(size_t chunk_bytes, int n_chunks) {
  if (chunk_bytes == 0 || n_chunks < 2)
    return Status::Error("staging ring: needs at least 2 chunks of at least 1 byte, not " +
                         std::to_string(n_chunks) + " of " + std::to_string(chunk_bytes));
  if (chunk_bytes > std::numeric_limits<size_t>::max() / static_cast<size_t>(n_chunks))
    return Status::Error("staging ring: " + std::to_string(n_chunks) + " chunks of " +
                         std::to_string(chunk_bytes) + " bytes overflow the address space");
  std::unique_ptr<StagingRing> ring(new StagingRing(chunk_bytes, n_chunks));
  const size_t total = chunk_bytes * static_cast<size_t>(n_chunks);
  const std::string what = "a staging ring of " + std::to_string(n_chunks) + " chunks of " +
                           DescribeBytes(chunk_bytes) + " (" + DescribeBytes(total) + ")";
  if (Status s = ring->memory_.Reserve(total, what); !s.ok()) {
    (void)cudaGetLastError();  // a refused allocation is not the next call's error
    return Status::Error(s.message() + "; fewer or smaller chunks may fit the pinned-memory limit");
  }
  ring->events_.reserve(static_cast<size_t>(n_chunks));
  for (int i = 0; i < n_chunks; ++i) {
    cudaEvent_t event = nullptr;
    MT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                            "staging ring: creating the event of chunk " + std::to_string(i));
    ring->events_.push_back(event);
  }
  return Expected<std::unique_ptr<StagingRing>>(std::move(ring));
}

StagingRing::~StagingRing() {
  // The chunks are freed after this body (memory_ is a member): no DMA may still read them.
  for (cudaEvent_t event : events_) {
    (void)cudaEventSynchronize(event);
    (void)cudaEventDestroy(event);
  }
}

Status StagingRing::Copy(std::span<const Range> ranges, cudaStream_t stream, ThreadPool* pool) {
  ScopedSeconds timer(&copy_seconds_);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.bytes > 0 && (r.src == nullptr || r.dst == nullptr))
      return Status::Error("staging ring: range " + std::to_string(i) + " of " +
                           std::to_string(ranges.size()) + " (" + std::to_string(r.bytes) +
                           " bytes) has a null " + (r.src == nullptr ? "source" : "destination"));
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    const auto* src = static_cast<const std::byte*>(r.src);
    auto* dst = static_cast<std::byte*>(r.dst);
    for (size_t done = 0; done < r.bytes;) {
      if (used_ == chunk_bytes_) MT_RETURN_IF_ERROR(Flush(stream, pool));
      const size_t n = std::min(r.bytes - done, chunk_bytes_ - used_);
      pieces_.push_back(Piece{src + done, dst + done, used_, n, i});
      used_ += n;
      done += n;
    }
  }
  if (used_ > 0) MT_RETURN_IF_ERROR(Flush(stream, pool));
  return OkStatus();
}

Status StagingRing::Drain() {
  for (int i = 0; i < n_chunks_; ++i) MT_RETURN_IF_ERROR(WaitForChunk(i));
  return OkStatus();
}

Status StagingRing::Flush(cudaStream_t stream, ThreadPool* pool) {
  const int chunk = current_;
  Status status = WaitForChunk(chunk);
  if (status.ok()) {
    Fill(pool);
    status = QueueDmas(stream);
    // Recorded even after a failed DMA: those queued before it still read the chunk.
    const cudaError_t recorded = cudaEventRecord(events_[static_cast<size_t>(chunk)], stream);
    if (recorded != cudaSuccess) {
      (void)cudaStreamSynchronize(stream);  // the chunk is then safe to reuse, event or not
      if (status.ok())
        status = CudaStatus(recorded, "staging ring: recording the event of chunk " +
                                          std::to_string(chunk) + " on the stream");
    }
    if (status.ok()) bytes_staged_ += used_;
  }
  if (!status.ok()) (void)cudaGetLastError();  // reported here; later calls must not see it
  pieces_.clear();
  used_ = 0;
  current_ = (current_ + 1) % n_chunks_;
  return status;
}

Status StagingRing::WaitForChunk(int i) {
  cudaEvent_t event = events_[static_cast<size_t>(i)];
  cudaError_t err = cudaEventQuery(event);  // success for an event never recorded
  if (err == cudaErrorNotReady) {
    ScopedSeconds timer(&wait_seconds_);
    err = cudaEventSynchronize(event);
  }
  if (err == cudaSuccess) return OkStatus();
  return CudaStatus(err, "staging ring: waiting for the copy out of chunk " + std::to_string(i));
}

void StagingRing::Fill(ThreadPool* pool) {
  std::byte* chunk = Chunk(current_);
  // Copies the bytes of pieces_ that fall in [begin, end) of the chunk.
  auto copy_span = [&](size_t begin, size_t end) {
    auto it = std::partition_point(pieces_.begin(), pieces_.end(), [&](const Piece& p) {
      return p.chunk_offset + p.bytes <= begin;
    });
    for (; it != pieces_.end() && it->chunk_offset < end; ++it) {
      const size_t lo = std::max(begin, it->chunk_offset);
      const size_t hi = std::min(end, it->chunk_offset + it->bytes);
      std::memcpy(chunk + lo, it->src + (lo - it->chunk_offset), hi - lo);
    }
  };
  const size_t max_parts = std::max<size_t>(1, used_ / kMinBytesPerThread);
  const size_t parts =
      pool == nullptr ? 1 : std::min(max_parts, static_cast<size_t>(std::max(1, pool->size())));
  if (parts == 1) {
    copy_span(0, used_);
    return;
  }
  // Part p covers [start(p), start(p + 1)); every part holds >= kMinBytesPerThread - kShareAlign.
  auto start = [&](size_t p) {
    if (p == parts) return used_;
    return used_ / parts * p / kShareAlign * kShareAlign;
  };
  pool->ParallelFor(parts, [&](size_t begin, size_t end, int) {
    for (size_t p = begin; p < end; ++p) copy_span(start(p), start(p + 1));
  });
}

Status StagingRing::QueueDmas(cudaStream_t stream) {
  const std::byte* chunk = Chunk(current_);
  for (size_t i = 0; i < pieces_.size();) {
    // A run of pieces whose device bytes follow one another (their chunk bytes always do).
    size_t j = i + 1;
    size_t run_bytes = pieces_[i].bytes;
    while (j < pieces_.size() && pieces_[j].dst == pieces_[i].dst + run_bytes) {
      run_bytes += pieces_[j].bytes;
      ++j;
    }
    const Piece& first = pieces_[i];
    MT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(first.dst, chunk + first.chunk_offset, run_bytes, cudaMemcpyHostToDevice,
                        stream),
        "staging ring: queuing the copy of " + std::to_string(run_bytes) +
            " bytes to the device for range " + std::to_string(first.range_index) +
            (j - i > 1 ? " (and the next " + std::to_string(j - i - 1) + ")" : std::string()) +
            " from chunk " + std::to_string(current_));
    i = j;
  }
  return OkStatus();
}

}  // namespace moetier::cuda
