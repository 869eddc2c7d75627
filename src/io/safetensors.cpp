#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace moetier {

namespace {

// The header is JSON text; 100 MB is the format's own cap and keeps a bad length from making us
// parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

Expected<SafetensorsEntry> ParseEntry(const std::string& name, const nlohmann::json& j) {
  const std::string where = "tensor '" + name + "'";
  if (!j.is_object()) return Status::Error(where + ": entry is not a JSON object");
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) return Status::Error(where + ": missing string 'dtype'");
  auto dtype = DTypeFromSafetensorsName(dt->get<std::string>());
  if (!dtype) return Status::Error(where + ": unknown dtype '" + dt->get<std::string>() + "'");

  auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array()) return Status::Error(where + ": missing array 'shape'");
  SafetensorsEntry e;
  e.name = name;
  e.dtype = *dtype;
  uint64_t n_elements = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
      return Status::Error(where + ": shape holds a value that is not a non-negative integer");
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (v != 0 && n_elements > std::numeric_limits<uint64_t>::max() / v))
      return Status::Error(where + ": shape " + sh->dump() + " overflows");
    n_elements *= v;
    e.shape.push_back(static_cast<int64_t>(v));
  }

  auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return Status::Error(where + ": 'data_offsets' must be two non-negative integers");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.end < e.begin)
    return Status::Error(where + ": data_offsets end " + std::to_string(e.end) + " < begin " +
                         std::to_string(e.begin));
  const uint64_t size = DTypeSize(e.dtype);
  if (n_elements > std::numeric_limits<uint64_t>::max() / size)
    return Status::Error(where + ": byte size overflows");
  if (n_elements * size != e.end - e.begin)
    return Status::Error(where + ": shape " + sh->dump() + " of " +
                         std::string(DTypeName(e.dtype)) + " needs " +
                         std::to_string(n_elements * size) + " bytes but data_offsets span " +
                         std::to_string(e.end - e.begin));
  return e;
}

// The format's rule: the tensors, in offset order, tile the data section exactly — each starts
// where the previous one ended, the first at 0 and the last at the end of the file. A header
// length a few bytes short (its JSON still parses: headers are space-padded) shifts every
// tensor by those bytes and leaves as many bytes trailing; only this rule catches that.
Status CheckDataCoverage(const std::vector<SafetensorsEntry>& sorted, uint64_t data_size) {
  uint64_t covered = 0;  // data bytes [0, covered) belong to the tensors so far
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : sorted) {
    if (e.begin > covered)
      return Status::Error("data bytes " + std::to_string(covered) + ".." +
                           std::to_string(e.begin) + " belong to no tensor (a hole before '" +
                           e.name + "'); the header's offsets or its length are wrong");
    if (e.begin < covered)
      return Status::Error("tensors '" + prev->name + "' and '" + e.name +
                           "' overlap (data bytes " + std::to_string(e.begin) + ".." +
                           std::to_string(covered) + ")");
    covered = e.end;
    prev = &e;
  }
  if (covered != data_size)
    return Status::Error(std::to_string(data_size - covered) +
                         " data bytes after the last tensor belong to no tensor; the header "
                         "length is too short or the file has bytes appended");
  return OkStatus();
}

}  // namespace

Expected<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* file, size_t file_size) {
  if (file_size < 8)
    return Status::Error("file is " + std::to_string(file_size) +
                         " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[i];
  if (header_len > file_size - 8)
    return Status::Error("header length " + std::to_string(header_len) +
                         " runs past the end of the file (" + std::to_string(file_size) +
                         " bytes); the file is truncated or not safetensors");
  if (header_len > kMaxHeaderBytes)
    return Status::Error("header length " + std::to_string(header_len) + " exceeds the 100 MB cap");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(file + 8, file + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return Status::Error("header JSON is not an object");

  SafetensorsHeader h;
  h.data_start = 8 + header_len;
  const uint64_t data_size = file_size - h.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Status::Error("'__metadata__' is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Status::Error("'__metadata__' value '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    MT_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(it.key(), *it));
    if (e.end > data_size)
      return Status::Error("tensor '" + e.name + "' ends at data byte " + std::to_string(e.end) +
                           " but the file holds " + std::to_string(data_size) +
                           " data bytes; the file is truncated");
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  MT_RETURN_IF_ERROR(CheckDataCoverage(h.tensors, data_size));
  return h;
}

Expected<SafetensorsFile> SafetensorsFile::Open(const std::filesystem::path& path) {
  SafetensorsFile f;
  MT_ASSIGN_OR_RETURN(f.file_, MappedFile::Open(path));
  auto header = ParseSafetensorsHeader(f.file_.data(), f.file_.size());
  if (!header.ok()) return header.status().WithContext(path.string());
  f.header_ = std::move(header).value();
  for (const auto& e : f.header_.tensors) {
    TensorView v;
    v.dtype = e.dtype;
    v.shape = e.shape;
    v.data = f.file_.data() + f.header_.data_start + e.begin;
    v.n_bytes = e.end - e.begin;
    f.views_.emplace(e.name, std::move(v));
  }
  return f;
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = views_.find(name);
  return it == views_.end() ? nullptr : &it->second;
}

}  // namespace moetier
