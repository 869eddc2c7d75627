// A converted model directory (moetier convert): config.json, moetier-index.json and data files.
// Dense tensors are memory-mapped views (a TensorStore); banks are read separately, with
// O_DIRECT, straight into their host buffers (FilePath and the index's offsets, for
// ReadFileRanges).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/bank_index.h"
#include "io/mapped_file.h"
#include "io/tensor_store.h"

namespace moetier {

// True when `dir` holds a converted model (its index file).
bool IsConvertedModelDir(const std::filesystem::path& dir);

class ConvertedModel final : public TensorStore {
 public:
  // Parses the index and checks each data file's size against it (a shorter file is an error
  // that says how many bytes are missing). Maps the data files; reads no tensor bytes.
  static Expected<ConvertedModel> Open(const std::filesystem::path& dir);

  ConvertedModel() = default;
  ConvertedModel(ConvertedModel&&) = default;
  ConvertedModel& operator=(ConvertedModel&&) = default;

  const BankIndex& index() const { return index_; }
  const std::filesystem::path& dir() const { return dir_; }

  const TensorView* Find(const std::string& name) const override;
  std::string FileOf(const std::string& name) const override;
  const std::string& description() const override { return index_path_; }
  std::vector<std::string> Names() const override;

  // Recomputes every dense tensor's xxh64 (reads them through the maps); an error names the
  // tensor and its file.
  Status VerifyDenseChecksums() const;

  std::filesystem::path FilePath(uint32_t file) const { return dir_ / index_.files[file].name; }
  // Bank `b`'s bytes through the data file's memory map (b.bytes long; Open checked the file
  // sizes), for streaming reads such as re-conversion. Not checksummed.
  const uint8_t* MappedBank(const BankIndexBank& b) const {
    return files_[b.file].data() + b.offset;
  }

 private:
  std::filesystem::path dir_;
  std::string index_path_;
  BankIndex index_;
  std::vector<MappedFile> files_;
  std::map<std::string, TensorView> views_;
  std::map<std::string, uint32_t> file_of_;
};

// xxh64 (seed 0) of a byte range, as the index records it.
uint64_t Checksum64(const void* data, size_t n_bytes);

}  // namespace moetier
