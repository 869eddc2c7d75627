// A Hugging Face checkpoint directory's tensors: `model.safetensors`, or the shards named by
// `model.safetensors.index.json`. Every tensor is a view into a memory map; nothing is copied.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "io/tensor_store.h"

namespace moetier {

class Checkpoint final : public TensorStore {
 public:
  // Opens every safetensors file of `dir` and checks that the index, when there is one, agrees
  // with the shards (each named tensor present in the shard the index says).
  Checkpoint() = default;
  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  static Expected<Checkpoint> OpenHfDirectory(const std::filesystem::path& dir);

  // The view of `name`, or nullptr.
  const TensorView* Find(const std::string& name) const override;
  // The file that holds `name` (for error messages); empty if none.
  std::string FileOf(const std::string& name) const override;
  // Every tensor name, sorted.
  std::vector<std::string> Names() const override;
  // The single file, or the index file, that describes this checkpoint (for error messages).
  const std::string& description() const override { return description_; }

 private:
  struct Entry {
    const TensorView* view;
    size_t file;
  };
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Entry> tensors_;
  std::string description_;
};

}  // namespace moetier
