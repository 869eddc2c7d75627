#include "model/convert.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/progress.h"
#include "io/bank_index.h"
#include "model/model_source.h"
#include "model/weight_binder.h"

namespace moetier {

namespace fs = std::filesystem;

namespace {

// Appends 4096-aligned items to numbered data files, starting a new file past the shard size.
class DataWriter {
 public:
  DataWriter(fs::path dir, uint64_t shard_bytes)
      : dir_(std::move(dir)), shard_bytes_(shard_bytes) {}
  ~DataWriter() { Close(); }

  // Positions the next item of n_bytes: a new file if this one would pass the shard size.
  Status Begin(uint64_t n_bytes, uint32_t* file, uint64_t* offset) {
    if (fd_ < 0 || (offset_ > 0 && offset_ + n_bytes > shard_bytes_))
      MT_RETURN_IF_ERROR(NextFile());
    MT_RETURN_IF_ERROR(Pad());
    *file = static_cast<uint32_t>(files_.size() - 1);
    *offset = offset_;
    return OkStatus();
  }
  Status Write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::Error(Path().string() + ": write failed: " + std::strerror(errno));
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset_ += static_cast<uint64_t>(w);
    }
    return OkStatus();
  }
  Status Zeros(uint64_t n) {
    static const std::vector<uint8_t> zeros(4096, 0);
    while (n > 0) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, zeros.size()));
      MT_RETURN_IF_ERROR(Write(zeros.data(), k));
      n -= k;
    }
    return OkStatus();
  }
  // Pads the file to a 4096 multiple (so every file can be read whole with O_DIRECT) and closes.
  Status Finish() {
    if (fd_ >= 0) {
      MT_RETURN_IF_ERROR(Pad());
      files_.back().bytes = offset_;
      if (::fsync(fd_) != 0)
        return Status::Error(Path().string() + ": fsync failed: " + std::strerror(errno));
    }
    Close();
    return OkStatus();
  }
  const std::vector<BankIndexFile>& files() const { return files_; }

 private:
  Status NextFile() {
    MT_RETURN_IF_ERROR(Finish());
    char name[32];
    std::snprintf(name, sizeof name, "data-%05zu.bin", files_.size());
    files_.push_back({name, 0});
    fd_ = ::open(Path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::Error(Path().string() + ": cannot create: " + std::strerror(errno));
    offset_ = 0;
    return OkStatus();
  }
  Status Pad() { return Zeros((4096 - offset_ % 4096) % 4096); }
  fs::path Path() const { return dir_ / files_.back().name; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  fs::path dir_;
  uint64_t shard_bytes_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  std::vector<BankIndexFile> files_;
};

// Files beside the weights that the converted directory keeps (tokenizer, templates, configs).
bool IsSideFile(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name == "model.safetensors.index.json" || name == kBankIndexFileName) return false;
  const std::string ext = p.extension().string();
  return ext == ".json" || ext == ".jinja" || ext == ".model" || ext == ".txt" ||
         name == "merges.txt";
}

}  // namespace

Expected<ConvertSummary> ConvertCheckpoint(const fs::path& hf_dir, const fs::path& out_dir,
                                           const ConvertOptions& options) {
  if (fs::exists(hf_dir / kBankIndexFileName))
    return Status::Error(hf_dir.string() +
                         ": already a converted model; convert takes a Hugging Face directory");
  MT_ASSIGN_OR_RETURN(ModelSource s, OpenModelSource(hf_dir));
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    return Status::Error(out_dir.string() + ": exists and is not a directory");
  if (fs::exists(out_dir) && !fs::is_empty(out_dir) && !options.overwrite)
    return Status::Error(out_dir.string() +
                         ": not empty; choose an empty --out directory or pass --overwrite");
  if (fs::exists(out_dir) && fs::equivalent(out_dir, hf_dir))
    return Status::Error(out_dir.string() + ": --out must differ from --model");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Status::Error(out_dir.string() + ": cannot create: " + ec.message());
  fs::remove(out_dir / kBankIndexFileName, ec);  // an old index must not describe new files

  // Every expert tensor goes into a bank; every other tensor is dense and is copied as is.
  std::set<std::string> expert_names;
  for (const auto& b : s.banks)
    for (int64_t e = 0; e < s.config.n_experts; ++e)
      for (ExpertMatrix m : {ExpertMatrix::kGate, ExpertMatrix::kUp, ExpertMatrix::kDown})
        expert_names.insert(s.spec->expert_tensor_name(b.layer, e, m));
  // Dense tensors grouped by the layer they belong to (-1: not in a layer), so the output
  // streams layer by layer: each layer's dense weights, then its bank.
  std::vector<std::vector<std::string>> dense_by_layer(static_cast<size_t>(s.config.n_layers + 1));
  uint64_t total = 0;
  for (const auto& name : s.hf->Names()) {
    if (expert_names.count(name)) continue;
    int64_t layer = -1;
    if (name.rfind("model.layers.", 0) == 0) layer = std::strtoll(name.c_str() + 13, nullptr, 10);
    if (layer < -1 || layer >= s.config.n_layers) layer = -1;
    dense_by_layer[static_cast<size_t>(layer + 1)].push_back(name);
    total += s.hf->Find(name)->n_bytes;
  }
  for (const auto& b : s.banks) total += b.bytes;

  BankIndex index;
  index.architecture = s.config.architecture;
  DataWriter out(out_dir, options.shard_bytes);
  Progress progress("converting", total);
  uint64_t done = 0;
  size_t next_bank = 0;
  const ExpertLayout& lay = s.layout;
  WeightBinder binder(*s.hf, s.config);

  for (int64_t group = -1; group < s.config.n_layers; ++group) {
    for (const auto& name : dense_by_layer[static_cast<size_t>(group + 1)]) {
      const TensorView* v = s.hf->Find(name);
      BankIndexTensor t{name, v->dtype, v->shape, 0, 0, v->n_bytes, XXH64(v->data, v->n_bytes, 0)};
      if (!IsWeightDType(v->dtype))
        return Status::Error(s.hf->FileOf(name) + ": tensor '" + name + "' has dtype " +
                             std::string(DTypeName(v->dtype)) +
                             "; weights must be BF16, F16 or F32");
      MT_RETURN_IF_ERROR(out.Begin(v->n_bytes, &t.file, &t.offset));
      MT_RETURN_IF_ERROR(out.Write(v->data, v->n_bytes));
      index.tensors.push_back(std::move(t));
      done += v->n_bytes;
    }
    if (next_bank < s.banks.size() && s.banks[next_bank].layer == group) {
      const LayerBank& lb = s.banks[next_bank++];
      BankIndexBank b;
      b.layer = lb.layer;
      b.bytes = lb.bytes;
      b.n_experts = s.config.n_experts;
      b.width = lay.width;
      b.d_model = lay.d_model;
      b.dtype = lay.dtype;
      b.expert_stride_bytes = lay.stride_bytes();
      MT_RETURN_IF_ERROR(out.Begin(b.bytes, &b.file, &b.offset));
      // Owned so every early return frees it.
      std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> owned(XXH64_createState(),
                                                                              &XXH64_freeState);
      XXH64_state_t* state = owned.get();
      XXH64_reset(state, 0);
      static const std::vector<uint8_t> zeros(4096, 0);
      for (int64_t e = 0; e < b.n_experts; ++e) {
        for (ExpertMatrix m : {ExpertMatrix::kGate, ExpertMatrix::kUp, ExpertMatrix::kDown}) {
          const std::vector<int64_t> shape = m == ExpertMatrix::kDown
                                                 ? std::vector<int64_t>{lay.d_model, lay.width}
                                                 : std::vector<int64_t>{lay.width, lay.d_model};
          const TensorView v = binder.Matrix(s.spec->expert_tensor_name(b.layer, e, m), shape);
          MT_RETURN_IF_ERROR(binder.status());
          if (v.dtype != lay.dtype)
            return Status::Error(s.hf->FileOf(s.spec->expert_tensor_name(b.layer, e, m)) +
                                 ": expert tensors of mixed dtypes (" +
                                 std::string(DTypeName(v.dtype)) + " and " +
                                 std::string(DTypeName(lay.dtype)) + ")");
          XXH64_update(state, v.data, v.n_bytes);
          MT_RETURN_IF_ERROR(out.Write(v.data, v.n_bytes));
        }
        const uint64_t pad = lay.stride_bytes() - 3 * lay.matrix_bytes();
        for (uint64_t left = pad; left > 0;) {
          const size_t k = static_cast<size_t>(std::min<uint64_t>(left, zeros.size()));
          XXH64_update(state, zeros.data(), k);
          left -= k;
        }
        MT_RETURN_IF_ERROR(out.Zeros(pad));
        done += lay.stride_bytes();
        progress.Update(done, "layer " + std::to_string(b.layer));
      }
      b.xxh64 = XXH64_digest(state);
      index.banks.push_back(b);
    }
    progress.Update(done);
  }
  MT_RETURN_IF_ERROR(out.Finish());
  progress.Finish();
  index.files = out.files();

  for (const auto& e : fs::directory_iterator(hf_dir)) {
    if (!e.is_regular_file() || !IsSideFile(e.path())) continue;
    fs::copy_file(e.path(), out_dir / e.path().filename(), fs::copy_options::overwrite_existing,
                  ec);
    if (ec)
      return Status::Error((out_dir / e.path().filename()).string() +
                           ": cannot copy: " + ec.message());
    // Keep the copies writable by their owner whatever the source's mode, so --overwrite works.
    fs::permissions(out_dir / e.path().filename(), fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add, ec);
  }
  // The index goes last, through a rename: a conversion that stops early leaves no index, so it
  // can never be mistaken for a complete model.
  const fs::path tmp = out_dir / (std::string(kBankIndexFileName) + ".tmp");
  {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) return Status::Error(tmp.string() + ": cannot create");
    const std::string text = SerializeBankIndex(index);
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) return Status::Error(tmp.string() + ": write failed");
  }
  fs::rename(tmp, out_dir / kBankIndexFileName, ec);
  if (ec)
    return Status::Error((out_dir / kBankIndexFileName).string() +
                         ": cannot write: " + ec.message());

  ConvertSummary sum;
  for (const auto& f : index.files) sum.bytes_written += f.bytes;
  sum.n_files = static_cast<int>(index.files.size());
  sum.n_banks = static_cast<int>(index.banks.size());
  sum.n_tensors = static_cast<int>(index.tensors.size());
  return sum;
}

}  // namespace moetier
