// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and [begin, end) byte offsets relative to the data that follows, then
// the data. https://github.com/huggingface/safetensors (format facts only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/mapped_file.h"

namespace moetier {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offset from the start of the data section
  uint64_t end = 0;    // one past the last byte
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in file order of their data
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // byte offset of the data section in the file
};

// Validates everything a reader relies on before it touches a tensor byte: the header length lies
// inside the file, the JSON is an object of well-formed entries, each dtype is known, each shape
// times the dtype size equals the byte range, and the ranges tile the data section exactly: no
// overlap, no hole, no byte past the last tensor, nothing beyond the end of the file (a
// truncated file). The message does not name the file; callers add it.
Expected<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* file, size_t file_size);

// A mapped safetensors file with its parsed header. Move-only; views into it live as long as it.
class SafetensorsFile {
 public:
  static Expected<SafetensorsFile> Open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  // The view of a tensor of this file, or nullptr.
  const TensorView* Find(const std::string& name) const;
  const std::map<std::string, TensorView>& views() const { return views_; }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, TensorView> views_;
};

}  // namespace moetier
