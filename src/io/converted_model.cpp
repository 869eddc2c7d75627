#include "io/converted_model.h"

#include <sys/mman.h>
#include <xxhash.h>

namespace moetier {

namespace fs = std::filesystem;

uint64_t Checksum64(const void* data, size_t n_bytes) {
  return XXH64(data, n_bytes, 0);
}

bool IsConvertedModelDir(const fs::path& dir) {
  // An index that cannot be examined (a symlink loop) counts as absent; opening the directory
  // as a checkpoint then fails with a message naming what is wrong.
  const Expected<PathKind> kind = KindOf(dir / kBankIndexFileName);
  return kind.ok() && *kind != PathKind::kMissing;
}

Expected<ConvertedModel> ConvertedModel::Open(const fs::path& dir) {
  ConvertedModel m;
  m.dir_ = dir;
  m.index_path_ = (dir / kBankIndexFileName).string();
  MT_ASSIGN_OR_RETURN(std::string text, ReadTextFile(m.index_path_));
  MT_ASSIGN_OR_RETURN(m.index_, ParseBankIndex(text, m.index_path_));
  for (const auto& f : m.index_.files) {
    const fs::path p = dir / f.name;
    MT_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::Open(p));
    if (mf.size() < f.bytes)
      return Status::Error(p.string() + ": file is " + std::to_string(mf.size()) + " bytes but " +
                           kBankIndexFileName + " says " + std::to_string(f.bytes) + " (" +
                           std::to_string(f.bytes - mf.size()) +
                           " bytes missing); the conversion was interrupted or the file was "
                           "truncated: re-run moetier convert");
    m.files_.push_back(std::move(mf));
  }
  for (const auto& t : m.index_.tensors) {
    TensorView v;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = m.files_[t.file].data() + t.offset;
    v.n_bytes = t.bytes;
    m.views_[t.name] = std::move(v);
    m.file_of_[t.name] = t.file;
  }
  return m;
}

const TensorView* ConvertedModel::Find(const std::string& name) const {
  auto it = views_.find(name);
  return it == views_.end() ? nullptr : &it->second;
}

std::string ConvertedModel::FileOf(const std::string& name) const {
  auto it = file_of_.find(name);
  return it == file_of_.end() ? index_path_ : FilePath(it->second).string();
}

std::vector<std::string> ConvertedModel::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, v] : views_) names.push_back(n);
  return names;
}

Status ConvertedModel::VerifyDenseChecksums() const {
  // Ask for every dense range up front: the kernel then reads them in large requests instead of
  // one small readahead window per page fault.
  for (const auto& t : index_.tensors) {
    const uintptr_t page = 4096;
    const auto start = reinterpret_cast<uintptr_t>(files_[t.file].data() + t.offset) & ~(page - 1);
    ::madvise(reinterpret_cast<void*>(start), t.bytes + 4096, MADV_WILLNEED);
  }
  for (const auto& t : index_.tensors) {
    const uint64_t got = Checksum64(files_[t.file].data() + t.offset, t.bytes);
    if (got != t.xxh64)
      return Status::Error(FilePath(t.file).string() + ": checksum mismatch in tensor '" + t.name +
                           "' (xxh64 " + Hex64(got) + ", index says " + Hex64(t.xxh64) +
                           "); the file is corrupt: re-run moetier convert");
  }
  return OkStatus();
}

}  // namespace moetier
