#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace moetier {

namespace {

// An open read-only descriptor of a regular file and its size. O_NONBLOCK makes the open itself
// return at once on a FIFO (a blocking open waits for a writer forever); the type is checked
// before any read. Regular files ignore O_NONBLOCK.
class RegularFile {
 public:
  static Expected<RegularFile> Open(const std::filesystem::path& path) {
    RegularFile f;
    f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f.fd_ < 0) return Status::Error(path.string() + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd_, &st) != 0)
      return Status::Error(path.string() + ": cannot stat: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return Status::Error(path.string() + ": is a directory, not a file");
    if (!S_ISREG(st.st_mode))
      return Status::Error(path.string() +
                           ": not a regular file (a FIFO, socket or device); give a file");
    f.size_ = static_cast<size_t>(st.st_size);
    return f;
  }
  RegularFile() = default;
  RegularFile(RegularFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}
  RegularFile& operator=(RegularFile&&) = delete;
  ~RegularFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  size_t size_ = 0;
};

}  // namespace

Expected<MappedFile> MappedFile::Open(const std::filesystem::path& path) {
  MT_ASSIGN_OR_RETURN(RegularFile file, RegularFile::Open(path));
  MappedFile f;
  f.path_ = path;
  f.size_ = file.size();
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (p == MAP_FAILED) {
      f.size_ = 0;
      return Status::Error(path.string() + ": cannot map: " + std::strerror(errno));
    }
    f.data_ = static_cast<const uint8_t*>(p);
  }
  return f;  // the mapping keeps the file referenced once the descriptor closes
}

MappedFile::~MappedFile() {
  Reset();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

Expected<std::string> ReadTextFile(const std::filesystem::path& path) {
  MT_ASSIGN_OR_RETURN(RegularFile file, RegularFile::Open(path));
  std::string text(file.size(), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(file.fd(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Error(path.string() + ": read failed: " + std::strerror(errno));
    if (n == 0) break;  // the file shrank while being read
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

Expected<PathKind> KindOf(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return PathKind::kMissing;
  if (ec) return Status::Error(path.string() + ": cannot examine: " + ec.message());
  if (st.type() == std::filesystem::file_type::regular) return PathKind::kRegular;
  if (st.type() == std::filesystem::file_type::directory) return PathKind::kDirectory;
  return PathKind::kOther;
}

}  // namespace moetier
