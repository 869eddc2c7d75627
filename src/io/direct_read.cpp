#include "io/direct_read.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

namespace moetier {

namespace {

// One descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads fully (pread may return short counts); returns errno or 0; EOF early is EIO.
int PreadAll(int fd, uint8_t* dst, size_t n, uint64_t off) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    dst += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return 0;
}

int ReadChunks(int fd, uint64_t offset, size_t n_bytes, uint8_t* dst, ThreadPool& pool) {
  const size_t n_chunks = (n_bytes + kDirectReadChunkBytes - 1) / kDirectReadChunkBytes;
  std::atomic<int> err{0};
  // Threads take the next chunk in file order, so the device sees one sequential stream with
  // several requests in flight, not several streams far apart (which seek on disks and
  // virtual block devices).
  std::atomic<size_t> next{0};
  pool.ParallelFor(static_cast<size_t>(pool.size()), [&](size_t, size_t, int) {
    for (size_t c = next.fetch_add(1); c < n_chunks && err.load() == 0; c = next.fetch_add(1)) {
      const size_t at = c * kDirectReadChunkBytes;
      const size_t len = std::min(kDirectReadChunkBytes, n_bytes - at);
      const int e = PreadAll(fd, dst + at, len, offset + at);
      if (e != 0) err.store(e);
    }
  });
  return err.load();
}

}  // namespace

Status ReadFileRange(const std::filesystem::path& path, uint64_t offset, size_t n_bytes,
                     uint8_t* dst, ThreadPool& io_pool, ReadMode* mode_used) {
  Fd direct;
  direct.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (direct.fd >= 0) {
    const int e = ReadChunks(direct.fd, offset, n_bytes, dst, io_pool);
    if (e == 0) {
      if (mode_used) *mode_used = ReadMode::kDirect;
      return OkStatus();
    }
    if (e != EINVAL)
      return Status::Error(path.string() + ": read failed at offset " + std::to_string(offset) +
                           ": " + std::strerror(e));
  }
  // The filesystem refuses O_DIRECT (open or read gave EINVAL): buffered reads.
  Fd buffered;
  buffered.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (buffered.fd < 0)
    return Status::Error(path.string() + ": cannot open: " + std::strerror(errno));
  const int e = ReadChunks(buffered.fd, offset, n_bytes, dst, io_pool);
  if (e != 0)
    return Status::Error(path.string() + ": read failed at offset " + std::to_string(offset) +
                         ": " + std::strerror(e));
  if (mode_used) *mode_used = ReadMode::kBuffered;
  return OkStatus();
}

}  // namespace moetier
