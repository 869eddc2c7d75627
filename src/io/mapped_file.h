// A read-only memory map of a whole file. Owned and move-only: the mapping lives as long as the
// object, and every TensorView into it must die first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/status.h"

namespace moetier {

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the file and the system's reason.
  static Expected<MappedFile> Open(const std::filesystem::path& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void Reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

// Reads a whole (small) text file such as config.json. Errors name the file. Like
// MappedFile::Open, it refuses anything but a regular file (a directory, a FIFO, a device)
// before reading, so it never blocks on a FIFO nobody writes.
Expected<std::string> ReadTextFile(const std::filesystem::path& path);

// What a path names, following symbolic links. Never throws: a path that cannot be examined (a
// symbolic-link loop, a permission denied on a parent) is an error naming it.
enum class PathKind { kMissing, kRegular, kDirectory, kOther };
Expected<PathKind> KindOf(const std::filesystem::path& path);

}  // namespace moetier
