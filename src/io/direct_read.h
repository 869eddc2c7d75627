// Reading large aligned file ranges straight into memory: O_DIRECT in aligned chunks on several
// threads (no page-cache copy, no cache pollution), falling back to buffered reads where the
// filesystem refuses O_DIRECT (tmpfs, some network filesystems).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/status.h"
#include "core/thread_pool.h"

namespace moetier {

// Chunk per read call: large enough to keep a fast NVMe queue busy, small enough that several
// threads share one bank.
inline constexpr size_t kDirectReadChunkBytes = 8u << 20;

enum class ReadMode { kDirect, kBuffered };

// Reads [offset, offset + n_bytes) of `path` into dst. offset, n_bytes and dst must be
// multiples of 4096 (the bank format guarantees it). Errors name the file.
Status ReadFileRange(const std::filesystem::path& path, uint64_t offset, size_t n_bytes,
                     uint8_t* dst, ThreadPool& io_pool, ReadMode* mode_used);

}  // namespace moetier
