#include "io/direct_read.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace moetier {

namespace {

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

// The files of a stream, each opened once with O_DIRECT and, where the filesystem refuses it
// (open or a read gave EINVAL), buffered instead from then on.
class FileSet {
 public:
  // Opens each distinct path of `ranges`; file_of(i) is range i's file.
  Status Open(std::span<const FileRange> ranges) {
    for (const FileRange& r : ranges) {
      size_t f = 0;
      while (f < files_.size() && files_[f].path != r.path) ++f;
      if (f == files_.size()) {
        files_.push_back(File{r.path});
        File& file = files_.back();
        file.direct_fd = ::open(r.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (file.direct_fd < 0) MT_RETURN_IF_ERROR(OpenBuffered(file));
      }
      file_of_.push_back(f);
    }
    return OkStatus();
  }
  ~FileSet() {
    for (const File& f : files_) {
      if (f.direct_fd >= 0) ::close(f.direct_fd);
      if (f.buffered_fd >= 0) ::close(f.buffered_fd);
    }
  }

  size_t file_of(size_t range) const { return file_of_[range]; }

  // Reads [off, off + n) of file f into dst; the error names the file and the offset.
  Status Read(size_t f, uint8_t* dst, size_t n, uint64_t off) {
    File& file = files_[f];
    if (!file.buffered.load(std::memory_order_acquire)) {
      const int e = PreadAll(file.direct_fd, dst, n, off);
      if (e == 0) return OkStatus();
      if (e != EINVAL) return ReadError(file, off, e);
      std::lock_guard<std::mutex> l(mu_);
      if (!file.buffered.load()) MT_RETURN_IF_ERROR(OpenBuffered(file));
    }
    const int e = PreadAll(file.buffered_fd, dst, n, off);
    return e == 0 ? OkStatus() : ReadError(file, off, e);
  }

  bool any_buffered() const {
    return std::any_of(files_.begin(), files_.end(),
                       [](const File& f) { return f.buffered.load(); });
  }

 private:
  struct File {
    std::filesystem::path path;
    int direct_fd = -1;
    int buffered_fd = -1;
    std::atomic<bool> buffered{false};
    explicit File(std::filesystem::path p) : path(std::move(p)) {}
    File(File&& o) noexcept
        : path(std::move(o.path)),
          direct_fd(std::exchange(o.direct_fd, -1)),
          buffered_fd(std::exchange(o.buffered_fd, -1)),
          buffered(o.buffered.load()) {}
  };

  static Status OpenBuffered(File& file) {
    file.buffered_fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file.buffered_fd < 0)
      return Status::Error(file.path.string() + ": cannot open: " + std::strerror(errno));
    file.buffered.store(true, std::memory_order_release);
    return OkStatus();
  }
  static Status ReadError(const File& file, uint64_t off, int e) {
    return Status::Error(file.path.string() + ": read failed at offset " + std::to_string(off) +
                         ": " + std::strerror(e));
  }

  std::vector<File> files_;
  std::vector<size_t> file_of_;
  std::mutex mu_;  // reopening a file buffered
};

// The chunks of every range, taken in file order by the reading threads (Work); each range's
// destination asked as the stream reaches it, and done called range by range as they complete.
// Two locks, so that a dst call waiting for a buffer (which frees once an earlier range is done)
// never holds up the completions it waits for.
class ChunkStream {
 public:
  ChunkStream(std::span<const FileRange> ranges, const RangeReader& reader, FileSet& files)
      : ranges_(ranges), reader_(reader), files_(files), left_(ranges.size()) {
    for (size_t i = 0; i < ranges.size(); ++i)
      left_[i] = (ranges[i].n_bytes + reader.chunk_bytes - 1) / reader.chunk_bytes;
  }

  // One reading thread: chunks until the stream ends or fails.
  void Work() {
    Chunk c;
    while (Take(c)) {
      const FileRange& r = ranges_[c.range];
      const Status st = files_.Read(files_.file_of(c.range), c.dst, c.len, r.offset + c.at);
      if (!st.ok()) return Fail(st);
      Complete(c.range);
    }
  }

  // After every Work returned: done for the ranges no chunk completed (empty ones at the end);
  // the first error.
  Status Finish() {
    {
      std::lock_guard<std::mutex> l(done_mu_);
      CallDone();
    }
    std::lock_guard<std::mutex> l(status_mu_);
    return status_;
  }

 private:
  struct Chunk {
    size_t range = 0;
    uint64_t at = 0;  // from the range's start
    size_t len = 0;
    uint8_t* dst = nullptr;
  };

  // The next chunk in order (asking a range's destination at its first); false at the end or
  // after an error.
  bool Take(Chunk& c) {
    std::lock_guard<std::mutex> l(take_mu_);
    while (!failed_.load()) {
      if (next_range_ == ranges_.size()) return false;
      const FileRange& r = ranges_[next_range_];
      if (next_dst_ == nullptr) {
        Expected<uint8_t*> d = reader_.dst(next_range_);
        if (!d.ok()) {
          Fail(d.status());
          return false;
        }
        next_dst_ = *d;
        asked_.store(next_range_ + 1);
      }
      if (next_at_ < r.n_bytes) {
        c = {next_range_, next_at_, std::min<size_t>(reader_.chunk_bytes, r.n_bytes - next_at_),
             next_dst_ + next_at_};
        next_at_ += c.len;
        return true;
      }
      ++next_range_;
      next_at_ = 0;
      next_dst_ = nullptr;
    }
    return false;
  }

  void Complete(size_t range) {
    std::lock_guard<std::mutex> l(done_mu_);
    --left_[range];
    CallDone();
  }

  // done for every range, in order, whose chunks are all read (under done_mu_).
  void CallDone() {
    while (next_done_ < asked_.load() && left_[next_done_] == 0 && !failed_.load()) {
      if (reader_.done) {
        const Status st = reader_.done(next_done_);
        if (!st.ok()) return Fail(st);
      }
      ++next_done_;
    }
  }

  void Fail(const Status& st) {
    std::lock_guard<std::mutex> l(status_mu_);
    if (status_.ok()) status_ = st;
    failed_.store(true);
  }

  std::span<const FileRange> ranges_;
  const RangeReader& reader_;
  FileSet& files_;

  std::mutex take_mu_;  // the next chunk; dst calls
  size_t next_range_ = 0;
  uint64_t next_at_ = 0;
  uint8_t* next_dst_ = nullptr;   // null until dst(next_range_) answered
  std::atomic<size_t> asked_{0};  // ranges whose dst was asked

  std::mutex done_mu_;        // chunks left; done calls
  std::vector<size_t> left_;  // chunks not yet read, per range
  size_t next_done_ = 0;

  std::mutex status_mu_;
  Status status_;
  std::atomic<bool> failed_{false};
};

}  // namespace

Status ReadFileRanges(std::span<const FileRange> ranges, const RangeReader& reader,
                      ThreadPool& io_pool, ReadMode* mode_used) {
  if (reader.chunk_bytes == 0 || reader.chunk_bytes % 4096 != 0)
    return Status::Error("read chunk of " + std::to_string(reader.chunk_bytes) +
                         " bytes: must be a positive multiple of 4096");
  FileSet files;
  MT_RETURN_IF_ERROR(files.Open(ranges));
  ChunkStream stream(ranges, reader, files);
  io_pool.ParallelFor(static_cast<size_t>(io_pool.size()),
                      [&](size_t, size_t, int) { stream.Work(); });
  MT_RETURN_IF_ERROR(stream.Finish());
  if (mode_used) *mode_used = files.any_buffered() ? ReadMode::kBuffered : ReadMode::kDirect;
  return OkStatus();
}

}  // namespace moetier
