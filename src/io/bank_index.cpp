#include "io/bank_index.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

namespace moetier {

namespace {

using nlohmann::json;

constexpr uint64_t kAlign = 4096;

struct Ctx {
  const std::string& source;
  Status Error(const std::string& what) const { return Status::Error(source + ": " + what); }
};

Expected<uint64_t> U64(const Ctx& c, const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_unsigned())
    return c.Error(where + ": '" + key + "' must be a non-negative integer");
  return j[key].get<uint64_t>();
}

Expected<uint64_t> Checksum(const Ctx& c, const json& j, const std::string& where) {
  if (!j.contains("xxh64") || !j["xxh64"].is_string() || j["xxh64"].get<std::string>().size() != 16)
    return c.Error(where + ": 'xxh64' must be 16 hex digits");
  const std::string s = j["xxh64"].get<std::string>();
  uint64_t v = 0;
  for (char ch : s) {
    int d;
    if (ch >= '0' && ch <= '9')
      d = ch - '0';
    else if (ch >= 'a' && ch <= 'f')
      d = ch - 'a' + 10;
    else
      return c.Error(where + ": 'xxh64' must be 16 lowercase hex digits");
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

// A weight dtype under `key`: BF16, F16, F32, or (our own format may hold them, safetensors
// cannot) Q8_0 / Q4_0.
Expected<DType> Dtype(const Ctx& c, const json& j, const std::string& where,
                      const char* key = "dtype") {
  if (!j.contains(key) || !j[key].is_string())
    return c.Error(where + ": missing string '" + key + "'");
  auto d = DTypeFromName(j[key].get<std::string>());
  if (!d || !IsWeightDType(*d))
    return c.Error(where + ": " + key + " " + j[key].dump() +
                   " is not BF16, F16, F32, Q8_0, Q4_0 or BF16C");
  return *d;
}

// Rows of a quantized dtype are whole 32-blocks: an index claiming otherwise cannot be read.
Status CheckRowLength(const Ctx& c, DType dtype, uint64_t row, const std::string& where,
                      const std::string& what) {
  if (IsValidRowLength(dtype, static_cast<int64_t>(row))) return OkStatus();
  return c.Error(where + ": " + what + " " + std::to_string(row) + " is not a multiple of " +
                 std::to_string(DTypeBlockElements(dtype)) + ", so it cannot be " +
                 std::string(DTypeName(dtype)) + "; re-run moetier convert");
}

struct Range {
  uint32_t file;
  uint64_t begin, end;
  std::string what;
};

Status CheckPlacement(const Ctx& c, const BankIndex& idx, uint32_t file, uint64_t offset,
                      uint64_t bytes, const std::string& where, std::vector<Range>& ranges) {
  if (file >= idx.files.size())
    return c.Error(where + ": 'file' " + std::to_string(file) + " is not in 'files'");
  if (offset % kAlign != 0)
    return c.Error(where + ": offset " + std::to_string(offset) + " is not 4096-aligned");
  if (bytes > idx.files[file].bytes || offset > idx.files[file].bytes - bytes)
    return c.Error(where + ": bytes " + std::to_string(offset) + ".." +
                   std::to_string(offset + bytes) + " lie past the end of " + idx.files[file].name +
                   " (" + std::to_string(idx.files[file].bytes) + " bytes)");
  ranges.push_back({file, offset, offset + bytes, where});
  return OkStatus();
}

}  // namespace

std::string Hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

Expected<BankIndex> ParseBankIndex(const std::string& text, const std::string& source) {
  const Ctx c{source};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return c.Error(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return c.Error("not a JSON object");
  if (!j.contains("format") || j["format"] != "moetier-bank")
    return c.Error("'format' is not \"moetier-bank\"; not a moetier converted model");
  if (!j.contains("version") || j["version"] != kBankFormatVersion)
    return c.Error("format version " + (j.contains("version") ? j["version"].dump() : "missing") +
                   " is not " + std::to_string(kBankFormatVersion) + "; re-run moetier convert");
  BankIndex idx;
  if (!j.contains("architecture") || !j["architecture"].is_string())
    return c.Error("missing string 'architecture'");
  idx.architecture = j["architecture"].get<std::string>();
  for (const char* key : {"files", "tensors", "banks"})
    if (!j.contains(key) || !j[key].is_array())
      return c.Error(std::string("missing array '") + key + "'");
  // Optional (indexes written before quantized conversion lack them): what convert was asked to
  // store the experts / dense matrices as.
  if (j.contains("expert_dtype")) {
    MT_ASSIGN_OR_RETURN(DType d, Dtype(c, j, "index", "expert_dtype"));
    idx.expert_dtype = d;
  }
  if (j.contains("dense_dtype")) {
    MT_ASSIGN_OR_RETURN(DType d, Dtype(c, j, "index", "dense_dtype"));
    idx.dense_dtype = d;
  }

  for (const auto& f : j["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      return c.Error("'files' entry without a 'name'");
    BankIndexFile file;
    file.name = f["name"].get<std::string>();
    if (file.name.empty() || file.name.find('/') != std::string::npos || file.name == "." ||
        file.name == "..")
      return c.Error("file name '" + file.name + "' is not a plain file name");
    MT_ASSIGN_OR_RETURN(file.bytes, U64(c, f, "bytes", "file '" + file.name + "'"));
    idx.files.push_back(std::move(file));
  }

  std::vector<Range> ranges;
  for (const auto& t : j["tensors"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      return c.Error("'tensors' entry without a 'name'");
    BankIndexTensor e;
    e.name = t["name"].get<std::string>();
    const std::string where = "tensor '" + e.name + "'";
    MT_ASSIGN_OR_RETURN(e.dtype, Dtype(c, t, where));
    if (!t.contains("shape") || !t["shape"].is_array()) return c.Error(where + ": missing 'shape'");
    uint64_t n = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40))
        return c.Error(where + ": bad shape " + t["shape"].dump());
      n *= d.get<uint64_t>();
      if (n > (1ull << 46))
        return c.Error(where + ": shape " + t["shape"].dump() + " is too large");
      e.shape.push_back(d.get<int64_t>());
    }
    MT_ASSIGN_OR_RETURN(uint64_t file, U64(c, t, "file", where));
    MT_ASSIGN_OR_RETURN(e.offset, U64(c, t, "offset", where));
    MT_ASSIGN_OR_RETURN(e.bytes, U64(c, t, "bytes", where));
    MT_ASSIGN_OR_RETURN(e.xxh64, Checksum(c, t, where));
    if (file > std::numeric_limits<uint32_t>::max()) return c.Error(where + ": bad 'file'");
    e.file = static_cast<uint32_t>(file);
    // rows × bytes per row: the only size rule that holds for block-quantized rows too.
    const uint64_t row = e.shape.empty() ? 1 : static_cast<uint64_t>(e.shape.back());
    if (IsBlockFormat(e.dtype) && e.shape.empty())
      return c.Error(where + ": a " + std::string(DTypeName(e.dtype)) +
                     " tensor needs a shape with rows; re-run moetier convert");
    MT_RETURN_IF_ERROR(CheckRowLength(c, e.dtype, row, where, "row length"));
    const uint64_t n_rows = row == 0 ? 0 : n / row;
    const uint64_t want = n_rows * DTypeRowBytes(e.dtype, static_cast<int64_t>(row));
    if (want != e.bytes)
      return c.Error(where + ": shape " + t["shape"].dump() + " of " +
                     std::string(DTypeName(e.dtype)) + " needs " + std::to_string(want) +
                     " bytes, index says " + std::to_string(e.bytes));
    MT_RETURN_IF_ERROR(CheckPlacement(c, idx, e.file, e.offset, e.bytes, where, ranges));
    idx.tensors.push_back(std::move(e));
  }

  for (const auto& b : j["banks"]) {
    if (!b.is_object()) return c.Error("'banks' entry is not an object");
    BankIndexBank e;
    MT_ASSIGN_OR_RETURN(uint64_t layer, U64(c, b, "layer", "bank"));
    if (layer > (1u << 20))
      return c.Error("bank layer " + std::to_string(layer) + " is out of range");
    e.layer = static_cast<int64_t>(layer);
    const std::string where = "bank of layer " + std::to_string(e.layer);
    MT_ASSIGN_OR_RETURN(e.dtype, Dtype(c, b, where));
    MT_ASSIGN_OR_RETURN(uint64_t file, U64(c, b, "file", where));
    MT_ASSIGN_OR_RETURN(e.offset, U64(c, b, "offset", where));
    MT_ASSIGN_OR_RETURN(e.bytes, U64(c, b, "bytes", where));
    MT_ASSIGN_OR_RETURN(e.xxh64, Checksum(c, b, where));
    MT_ASSIGN_OR_RETURN(uint64_t n_experts, U64(c, b, "n_experts", where));
    MT_ASSIGN_OR_RETURN(uint64_t width, U64(c, b, "width", where));
    MT_ASSIGN_OR_RETURN(uint64_t d_model, U64(c, b, "d_model", where));
    MT_ASSIGN_OR_RETURN(e.expert_stride_bytes, U64(c, b, "expert_stride_bytes", where));
    if (file > std::numeric_limits<uint32_t>::max()) return c.Error(where + ": bad 'file'");
    if (n_experts == 0 || width == 0 || d_model == 0 || n_experts > (1u << 20) ||
        width > (1u << 24) || d_model > (1u << 24))
      return c.Error(where + ": n_experts, width and d_model must be positive and sane");
    e.file = static_cast<uint32_t>(file);
    e.n_experts = static_cast<int64_t>(n_experts);
    e.width = static_cast<int64_t>(width);
    e.d_model = static_cast<int64_t>(d_model);
    MT_RETURN_IF_ERROR(CheckRowLength(c, e.dtype, d_model, where, "d_model"));
    MT_RETURN_IF_ERROR(CheckRowLength(c, e.dtype, width, where, "width"));
    // gate and up: width rows of d_model; down: d_model rows of width (ExpertLayout's packing).
    const uint64_t expert_bytes =
        2 * width * DTypeRowBytes(e.dtype, static_cast<int64_t>(d_model)) +
        d_model * DTypeRowBytes(e.dtype, static_cast<int64_t>(width));
    if (e.expert_stride_bytes < expert_bytes || e.expert_stride_bytes % kAlign != 0)
      return c.Error(where + ": expert_stride_bytes " + std::to_string(e.expert_stride_bytes) +
                     " must be a multiple of 4096 holding " + std::to_string(expert_bytes) +
                     " bytes");
    // Checked without wrapping: a stride whose product with n_experts overflows could otherwise
    // match `bytes` and send expert e's address far past the bank.
    uint64_t stride_total = 0;
    if (__builtin_mul_overflow(e.expert_stride_bytes, n_experts, &stride_total) ||
        e.bytes != stride_total)
      return c.Error(where + ": bytes " + std::to_string(e.bytes) +
                     " != n_experts × expert_stride_bytes");
    MT_RETURN_IF_ERROR(CheckPlacement(c, idx, e.file, e.offset, e.bytes, where, ranges));
    if (!idx.banks.empty() && idx.banks.back().layer >= e.layer)
      return c.Error("banks are not in ascending layer order at layer " + std::to_string(e.layer));
    if (idx.expert_dtype && e.dtype != *idx.expert_dtype)
      return c.Error(where + ": dtype " + std::string(DTypeName(e.dtype)) +
                     " contradicts 'expert_dtype' " + std::string(DTypeName(*idx.expert_dtype)));
    idx.banks.push_back(e);
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.file != b.file ? a.file < b.file : a.begin < b.begin;
  });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].file == ranges[i - 1].file && ranges[i].begin < ranges[i - 1].end &&
        ranges[i].begin != ranges[i].end)
      return c.Error(ranges[i - 1].what + " and " + ranges[i].what + " overlap");
  return idx;
}

std::string SerializeBankIndex(const BankIndex& idx) {
  nlohmann::ordered_json j;
  j["format"] = "moetier-bank";
  j["version"] = kBankFormatVersion;
  j["architecture"] = idx.architecture;
  if (idx.expert_dtype) j["expert_dtype"] = std::string(DTypeName(*idx.expert_dtype));
  if (idx.dense_dtype) j["dense_dtype"] = std::string(DTypeName(*idx.dense_dtype));
  j["files"] = nlohmann::ordered_json::array();
  for (const auto& f : idx.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["tensors"] = nlohmann::ordered_json::array();
  for (const auto& t : idx.tensors)
    j["tensors"].push_back({{"name", t.name},
                            {"dtype", std::string(DTypeName(t.dtype))},
                            {"shape", t.shape},
                            {"file", t.file},
                            {"offset", t.offset},
                            {"bytes", t.bytes},
                            {"xxh64", Hex64(t.xxh64)}});
  j["banks"] = nlohmann::ordered_json::array();
  for (const auto& b : idx.banks)
    j["banks"].push_back({{"layer", b.layer},
                          {"dtype", std::string(DTypeName(b.dtype))},
                          {"n_experts", b.n_experts},
                          {"width", b.width},
                          {"d_model", b.d_model},
                          {"expert_stride_bytes", b.expert_stride_bytes},
                          {"file", b.file},
                          {"offset", b.offset},
                          {"bytes", b.bytes},
                          {"xxh64", Hex64(b.xxh64)}});
  return j.dump(1) + "\n";
}

}  // namespace moetier
