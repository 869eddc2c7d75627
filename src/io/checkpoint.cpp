#include "io/checkpoint.h"

#include <nlohmann/json.hpp>
#include <set>

#include "io/json_file.h"

namespace moetier {

namespace fs = std::filesystem;

namespace {

// Shard file names must stay inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

}  // namespace

Expected<Checkpoint> Checkpoint::OpenHfDirectory(const fs::path& dir) {
  Checkpoint c;
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name

  MT_ASSIGN_OR_RETURN(const PathKind index_kind, KindOf(index_path));
  MT_ASSIGN_OR_RETURN(const PathKind single_kind, KindOf(single_path));
  if (index_kind != PathKind::kMissing) {
    c.description_ = index_path.string();
    MT_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(index_path));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return Status::Error(index_path.string() + ": missing object 'weight_map'");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string() || !IsPlainFileName(it->get<std::string>()))
        return Status::Error(index_path.string() + ": weight_map entry '" + it.key() +
                             "' is not a file name in this directory");
      weight_map[it.key()] = it->get<std::string>();
    }
    std::set<std::string> shard_names;
    for (const auto& [name, shard] : weight_map) shard_names.insert(shard);
    std::map<std::string, size_t> shard_index;
    for (const auto& shard : shard_names) {
      MT_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(dir / shard));
      shard_index[shard] = c.files_.size();
      c.files_.push_back(std::move(f));
    }
    for (const auto& [name, shard] : weight_map) {
      const size_t fi = shard_index[shard];
      const TensorView* v = c.files_[fi].Find(name);
      if (v == nullptr)
        return Status::Error((dir / shard).string() + ": tensor '" + name + "' is missing, but " +
                             index_path.filename().string() + " says this shard holds it");
      c.tensors_[name] = Entry{v, fi};
    }
  } else if (single_kind != PathKind::kMissing) {
    c.description_ = single_path.string();
    MT_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(single_path));
    c.files_.push_back(std::move(f));
    for (const auto& [name, view] : c.files_[0].views()) c.tensors_[name] = Entry{&view, 0};
  } else {
    return Status::Error(dir.string() +
                         ": no model.safetensors or model.safetensors.index.json; expected a "
                         "Hugging Face model directory");
  }
  return c;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.view;
}

std::string Checkpoint::FileOf(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? description_ : files_[it->second.file].path().string();
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) names.push_back(name);
  return names;
}

}  // namespace moetier
