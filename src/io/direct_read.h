// Reading large aligned file ranges straight into memory: O_DIRECT in aligned chunks on several
// threads (no page-cache copy, no cache pollution), falling back to buffered reads where the
// filesystem refuses O_DIRECT (tmpfs, some network filesystems).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>

#include "core/status.h"
#include "core/thread_pool.h"

namespace moetier {

// Chunk per read call: large enough to keep a fast NVMe queue busy, small enough that several
// threads share one bank.
inline constexpr size_t kDirectReadChunkBytes = 8u << 20;

enum class ReadMode { kDirect, kBuffered };

// [offset, offset + n_bytes) of a file; offset and n_bytes multiples of 4096.
struct FileRange {
  std::filesystem::path path;
  uint64_t offset = 0;
  size_t n_bytes = 0;
};

// Reads `ranges` as one stream of chunk_bytes chunks in file order over io_pool's threads, so
// the device keeps as many requests in flight at a range's end as in its middle. Range i's
// destination (4096-aligned, at least n_bytes) comes from dst(i), asked once, when the stream
// reaches range i (it may wait: for a free buffer); done(i) runs once ranges 0..i are all read,
// in order, never two at once. dst and done run on reading threads. The first error (a read's,
// naming the file and offset, or one dst or done returned) stops the stream: no chunk is taken
// after it, and it is returned once the chunks in flight end. `mode_used` becomes kBuffered if
// any file was read buffered.
struct RangeReader {
  std::function<Expected<uint8_t*>(size_t range)> dst;
  std::function<Status(size_t range)> done;  // may be empty
  size_t chunk_bytes = kDirectReadChunkBytes;
};
Status ReadFileRanges(std::span<const FileRange> ranges, const RangeReader& reader,
                      ThreadPool& io_pool, ReadMode* mode_used);

}  // namespace moetier
