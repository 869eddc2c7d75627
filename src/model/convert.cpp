#include "model/convert.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/bank_index.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
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

// Output bytes assembled per parallel step before one write: a whole expert of the largest
// models (DeepSeek-V3: ~44 MB in bf16) fits, so every step has thousands of rows to share among
// the threads and every write is large; small next to the page cache the checkpoint streams
// through.
constexpr uint64_t kChunkBytes = 64ull << 20;

// An xxh64 stream (seed 0), owned so every early return frees it.
class Hasher {
 public:
  Hasher() : state_(XXH64_createState(), &XXH64_freeState) { XXH64_reset(state_.get(), 0); }
  void Update(const void* data, size_t n) { XXH64_update(state_.get(), data, n); }
  uint64_t Digest() const { return XXH64_digest(state_.get()); }

 private:
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state_;
};

// Writes rows [r0, r0 + n_rows) of `src` (f32/f16/bf16/bf16c, rows of k elements) to `dst` as
// `to` (kBF16, kBF16C, kQ8_0 or kQ4_0), DTypeRowBytes(to, k) bytes a row. Same dtype: a copy.
// Otherwise each row goes through float32 (exact for every source dtype), so bf16 is one
// round-to-nearest-even and the quantizers see the exact source values. `scratch` holds k
// floats. Returns the first row (of the tensor) that BF16C cannot hold (PackRowBf16c), or -1.
int64_t ConvertRows(const TensorView& src, int64_t k, int64_t r0, int64_t n_rows, DType to,
                    uint8_t* dst, float* scratch) {
  if (src.dtype == to) {
    const size_t row = DTypeRowBytes(to, k);
    std::memcpy(dst, src.bytes() + static_cast<size_t>(r0) * row,
                static_cast<size_t>(n_rows) * row);
    return -1;
  }
  const size_t out_row = DTypeRowBytes(to, k);
  for (int64_t r = 0; r < n_rows; ++r) {
    uint8_t* out = dst + static_cast<size_t>(r) * out_row;
    kernels::RowToF32(src, (r0 + r) * k, k, scratch);
    switch (to) {
      case DType::kQ8_0:
        kernels::QuantizeRowQ8_0(scratch, k, out);
        break;
      case DType::kQ4_0:
        kernels::QuantizeRowQ4_0(scratch, k, out);
        break;
      case DType::kBF16C: {
        // The bf16 bits in place over the floats' first half (each read before it is written).
        auto* bits = reinterpret_cast<uint16_t*>(scratch);
        for (int64_t j = 0; j < k; ++j) bits[j] = F32ToBf16(scratch[j]);
        if (kernels::PackRowBf16c(bits, k, out) < 0) return r0 + r;
        break;
      }
      default:  // kBF16 (ConvertCheckpoint admits no other target)
        for (int64_t j = 0; j < k; ++j) {
          const uint16_t h = F32ToBf16(scratch[j]);
          std::memcpy(out + 2 * j, &h, 2);
        }
        break;
    }
  }
  return -1;
}

// The message for a row BF16C cannot hold.
Status Bf16cRowError(const std::string& file, const std::string& name, int64_t row, bool expert) {
  return Status::Error(file + ": tensor '" + name + "' row " + std::to_string(row) +
                       " has more than " + std::to_string(kernels::kBf16cMaxExceptions) +
                       " weights outside its 16 most common sign/exponent classes, more than "
                       "bf16c stores a row; convert with " +
                       (expert ? "--dtype bf16" : "--dense-dtype bf16") + " instead");
}

// Dtypes whose values convert exactly to float32: what convert may re-encode.
bool IsFloatDType(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kBF16C;
}

// The dtype --dense-dtype stores dense tensor `v` as. Converted: every 2-D float matrix but the
// routers. Routers stay as they are because their logits choose the experts: a small error there
// changes which experts run, and they are a few KB a layer. 1-D tensors (norms, biases) are tiny
// and feed every element. A quantized target also needs rows of whole 32-blocks; other matrices
// stay as they are rather than failing the conversion (llama.cpp's quantizer does the same), and
// so do matrices whose rows BF16C would not make smaller.
DType DenseTarget(const std::string& name, const TensorView& v, std::optional<DType> to,
                  const std::set<std::string>& routers) {
  if (!to || v.shape.size() != 2 || !IsFloatDType(v.dtype) || routers.count(name)) return v.dtype;
  if (!IsValidRowLength(*to, v.shape[1])) return v.dtype;
  // BF16C's 64-byte row header outweighs what packing saves on rows of 128 or fewer.
  if (*to == DType::kBF16C &&
      DTypeRowBytes(*to, v.shape[1]) >= DTypeRowBytes(DType::kBF16, v.shape[1]))
    return v.dtype;
  return *to;
}

// Files beside the weights that the converted directory keeps (tokenizer, templates, configs).
bool IsSideFile(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name == "model.safetensors.index.json" || name == kBankIndexFileName) return false;
  const std::string ext = p.extension().string();
  return ext == ".json" || ext == ".jinja" || ext == ".model" || ext == ".txt" ||
         name == "merges.txt";
}

// The bytes of `layer`'s bank in a converted source (memory-mapped), once its xxh64 matches
// the index.
Expected<const uint8_t*> VerifiedSourceBank(const ConvertedModel& m, int64_t layer) {
  for (const BankIndexBank& b : m.index().banks) {
    if (b.layer != layer) continue;
    const uint8_t* bytes = m.MappedBank(b);
    if (Checksum64(bytes, b.bytes) != b.xxh64)
      return Status::Error(m.FilePath(b.file).string() + ": the bank of layer " +
                           std::to_string(layer) +
                           " does not match its checksum in the index (damaged or changed "
                           "since it was written); convert from the Hugging Face checkpoint");
    return bytes;
  }
  return Status::Error(m.description() + ": no bank for layer " + std::to_string(layer));
}

}  // namespace

std::optional<DType> ConvertDTypeFromFlag(std::string_view flag) {
  constexpr DType kDTypes[] = {DType::kBF16, DType::kBF16C, DType::kQ8_0, DType::kQ4_0};
  static_assert(std::size(kDTypes) == kConvertDTypeFlags.size());
  for (size_t i = 0; i < kConvertDTypeFlags.size(); ++i)
    if (kConvertDTypeFlags[i] == flag) return kDTypes[i];
  return std::nullopt;
}

Expected<ConvertSummary> ConvertCheckpoint(const fs::path& hf_dir, const fs::path& out_dir,
                                           const ConvertOptions& options) {
  for (const std::optional<DType> d :
       {std::optional<DType>(options.expert_dtype), options.dense_dtype})
    if (d && *d != DType::kBF16 && !IsBlockFormat(*d))
      return Status::Error("convert: cannot store weights as " + std::string(DTypeName(*d)) +
                           "; choose bf16, bf16c, q8_0 or q4_0");
  MT_ASSIGN_OR_RETURN(ModelSource s, OpenModelSource(hf_dir));
  // The source's tensors: a Hugging Face checkpoint, or a converted model (its dense tensors;
  // its banks are read through VerifiedSourceBank and ExpertLayout::Views).
  const TensorStore& src = s.dense();
  const bool from_converted = s.converted != nullptr;
  // `in` is the checkpoint's expert layout, `lay` the one written.
  const ExpertLayout& in = s.layout;
  const ExpertLayout lay{in.d_model, in.width, options.expert_dtype};
  if (!s.banks.empty() && !lay.valid()) {
    // Named by the first matrix whose rows do not fit, before anything is written.
    const bool gate = !IsValidRowLength(lay.dtype, lay.d_model);
    const std::string name = s.spec->expert_tensor_name(
        s.banks[0].layer, 0, gate ? ExpertMatrix::kGate : ExpertMatrix::kDown);
    return Status::Error(src.FileOf(name) + ": expert tensor '" + name + "' has rows of " +
                         std::to_string(gate ? lay.d_model : lay.width) + " elements (" +
                         (gate ? "hidden_size" : "the expert width") +
                         "), not a multiple of 32, so it cannot be stored as " +
                         std::string(DTypeName(lay.dtype)) + "; use --dtype bf16");
  }
  // Quantized experts (a converted source) can be copied into the same dtype (to re-encode the
  // dense matrices or re-shard), never quantized again.
  if (!s.banks.empty() && !IsFloatDType(in.dtype) && in.dtype != lay.dtype)
    return Status::Error(src.description() + ": experts are " + std::string(DTypeName(in.dtype)) +
                         "; convert re-encodes BF16, F16 or F32 experts and copies quantized "
                         "ones as they are (--dtype " +
                         std::string(DTypeName(in.dtype)) + "); for " +
                         std::string(DTypeName(lay.dtype)) +
                         " convert from the Hugging Face checkpoint or a bf16 conversion of it");
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

  // Every expert tensor goes into a bank; every other tensor is dense.
  const std::set<std::string> expert_names = ExpertTensorNames(s), routers = RouterTensorNames(s);
  // Dense tensors grouped by the layer they belong to (-1: not in a layer), so the output
  // streams layer by layer: each layer's dense weights, then its bank.
  std::vector<std::vector<std::string>> dense_by_layer(static_cast<size_t>(s.config.n_layers + 1));
  uint64_t total = 0;  // progress counts the checkpoint's bytes read
  for (const auto& name : src.Names()) {
    if (expert_names.count(name)) continue;
    int64_t layer = -1;
    if (name.rfind("model.layers.", 0) == 0) layer = std::strtoll(name.c_str() + 13, nullptr, 10);
    if (layer < -1 || layer >= s.config.n_layers) layer = -1;
    dense_by_layer[static_cast<size_t>(layer + 1)].push_back(name);
    total += src.Find(name)->n_bytes;
  }
  for (const auto& b : s.banks) total += b.bytes;

  // A converted source: every byte read is checked against its index first (its dense tensors
  // here, each bank before it is converted), so a damaged file is an error, not a model.
  if (from_converted) MT_RETURN_IF_ERROR(s.converted->VerifyDenseChecksums());
  // With --dense-dtype same, what the source recorded stays true of the output.
  const std::optional<DType> dense_dtype = options.dense_dtype || !from_converted
                                               ? options.dense_dtype
                                               : s.converted->index().dense_dtype;

  BankIndex index;
  index.architecture = s.config.architecture;
  index.expert_dtype = lay.dtype;
  index.dense_dtype = dense_dtype;
  DataWriter out(out_dir, options.shard_bytes);
  Progress progress("converting", total);
  uint64_t done = 0;
  size_t next_bank = 0;
  WeightBinder binder(src, s.config);
  ThreadPool pool(options.n_threads);
  // Per thread: one source row in float32 (rows are at most max(d_model, width) long for
  // experts; dense tensors resize it before their parallel step).
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.size()));
  std::vector<uint8_t> chunk;  // reused: one parallel step's output
  int n_dense_converted = 0;

  for (int64_t group = -1; group < s.config.n_layers; ++group) {
    for (const auto& name : dense_by_layer[static_cast<size_t>(group + 1)]) {
      const TensorView* v = src.Find(name);
      if (!IsWeightDType(v->dtype) || (!from_converted && !IsFloatDType(v->dtype)))
        return Status::Error(src.FileOf(name) + ": tensor '" + name + "' has dtype " +
                             std::string(DTypeName(v->dtype)) +
                             "; weights must be BF16, F16 or F32");
      const DType to = DenseTarget(name, *v, options.dense_dtype, routers);
      // A quantized tensor of a converted source can only be copied: re-encoding it would
      // quantize twice. (The index would also claim a dtype it does not have.)
      if (!IsFloatDType(v->dtype) && options.dense_dtype && *options.dense_dtype != v->dtype &&
          v->shape.size() == 2 && !routers.count(name))
        return Status::Error(src.FileOf(name) + ": tensor '" + name + "' is already " +
                             std::string(DTypeName(v->dtype)) + " and cannot be re-encoded as " +
                             std::string(DTypeName(*options.dense_dtype)) +
                             " (that would quantize it twice): pass --dense-dtype same, or "
                             "convert from the Hugging Face checkpoint");
      if (to == v->dtype) {  // as in the checkpoint: straight from its map
        BankIndexTensor t{
            name, v->dtype, v->shape, 0, 0, v->n_bytes, XXH64(v->data, v->n_bytes, 0)};
        MT_RETURN_IF_ERROR(out.Begin(v->n_bytes, &t.file, &t.offset));
        MT_RETURN_IF_ERROR(out.Write(v->data, v->n_bytes));
        index.tensors.push_back(std::move(t));
        done += v->n_bytes;
        continue;
      }
      // [rows, k] converted in chunks of rows, each chunk's rows shared among the threads.
      const int64_t rows = v->shape[0], k = v->shape[1];
      const size_t out_row = DTypeRowBytes(to, k);
      const size_t in_row = v->n_bytes / static_cast<size_t>(std::max<int64_t>(rows, 1));
      BankIndexTensor t{name, to, v->shape, 0, 0, static_cast<uint64_t>(rows) * out_row, 0};
      MT_RETURN_IF_ERROR(out.Begin(t.bytes, &t.file, &t.offset));
      const int64_t rows_per_chunk =
          std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / std::max<size_t>(out_row, 1)));
      for (auto& sc : scratch) sc.resize(static_cast<size_t>(k));
      Hasher hash;
      for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
        const int64_t n = std::min(rows_per_chunk, rows - r0);
        chunk.resize(static_cast<size_t>(n) * out_row);
        std::atomic<int64_t> bad_row{-1};
        pool.ParallelFor(static_cast<size_t>(n), [&](size_t b, size_t e, int thread) {
          const int64_t bad =
              ConvertRows(*v, k, r0 + static_cast<int64_t>(b), static_cast<int64_t>(e - b), to,
                          chunk.data() + b * out_row, scratch[static_cast<size_t>(thread)].data());
          if (bad >= 0) bad_row.store(bad);
        });
        if (bad_row.load() >= 0) return Bf16cRowError(src.FileOf(name), name, bad_row, false);
        hash.Update(chunk.data(), chunk.size());
        MT_RETURN_IF_ERROR(out.Write(chunk.data(), chunk.size()));
        done += static_cast<uint64_t>(n) * in_row;
        progress.Update(done, name);
      }
      t.xxh64 = hash.Digest();
      index.tensors.push_back(std::move(t));
      ++n_dense_converted;
    }
    if (next_bank < s.banks.size() && s.banks[next_bank].layer == group) {
      const LayerBank& lb = s.banks[next_bank++];
      BankIndexBank b;
      b.layer = lb.layer;
      b.n_experts = s.config.n_experts;
      b.bytes = lay.bank_bytes(b.n_experts);
      b.width = lay.width;
      b.d_model = lay.d_model;
      b.dtype = lay.dtype;
      b.expert_stride_bytes = lay.stride_bytes();
      MT_RETURN_IF_ERROR(out.Begin(b.bytes, &b.file, &b.offset));
      const uint8_t* src_bank = nullptr;  // a converted source's bank, checked
      if (from_converted) {
        MT_ASSIGN_OR_RETURN(src_bank, VerifiedSourceBank(*s.converted, b.layer));
      }
      for (auto& sc : scratch) sc.resize(static_cast<size_t>(std::max(lay.d_model, lay.width)));
      Hasher hash;
      // Experts are converted a chunk at a time: the chunk's rows (gate, up, down of each
      // expert) are shared among the threads, then the chunk is hashed and written in order.
      const int64_t per_chunk = std::max<int64_t>(
          1, static_cast<int64_t>(kChunkBytes / std::max<uint64_t>(lay.stride_bytes(), 1)));
      const int64_t rows_per_expert = 2 * lay.width + lay.d_model;
      std::vector<ExpertWeights> experts;
      for (int64_t e0 = 0; e0 < b.n_experts; e0 += per_chunk) {
        const int64_t n = std::min(per_chunk, b.n_experts - e0);
        experts.assign(static_cast<size_t>(n), ExpertWeights{});
        for (int64_t i = 0; i < n; ++i) {
          ExpertWeights& w = experts[static_cast<size_t>(i)];
          if (src_bank != nullptr) {
            w = in.Views(src_bank, e0 + i);
            continue;
          }
          for (ExpertMatrix m : {ExpertMatrix::kGate, ExpertMatrix::kUp, ExpertMatrix::kDown}) {
            const std::string name = s.spec->expert_tensor_name(b.layer, e0 + i, m);
            const std::vector<int64_t> shape = m == ExpertMatrix::kDown
                                                   ? std::vector<int64_t>{in.d_model, in.width}
                                                   : std::vector<int64_t>{in.width, in.d_model};
            const TensorView v = binder.Matrix(name, shape);
            MT_RETURN_IF_ERROR(binder.status());
            if (v.dtype != in.dtype)
              return Status::Error(src.FileOf(name) + ": expert tensors of mixed dtypes (" +
                                   std::string(DTypeName(v.dtype)) + " and " +
                                   std::string(DTypeName(in.dtype)) + ")");
            (m == ExpertMatrix::kGate ? w.gate : m == ExpertMatrix::kUp ? w.up : w.down) = v;
          }
        }
        chunk.resize(static_cast<size_t>(n) * lay.stride_bytes());
        std::atomic<int64_t> bad_row{-1};  // index i below of a row BF16C cannot hold
        pool.ParallelFor(static_cast<size_t>(n * rows_per_expert), [&](size_t b0, size_t b1,
                                                                       int thread) {
          float* sc = scratch[static_cast<size_t>(thread)].data();
          for (size_t i = b0; i < b1; ++i) {
            const int64_t e = static_cast<int64_t>(i) / rows_per_expert;
            int64_t r = static_cast<int64_t>(i) % rows_per_expert;
            const ExpertWeights& w = experts[static_cast<size_t>(e)];
            uint8_t* base = chunk.data() + static_cast<size_t>(e) * lay.stride_bytes();
            int64_t bad;
            if (r < lay.width) {
              bad = ConvertRows(
                  w.gate, lay.d_model, r, 1, lay.dtype,
                  base + lay.gate_offset() + r * DTypeRowBytes(lay.dtype, lay.d_model), sc);
            } else if ((r -= lay.width) < lay.width) {
              bad = ConvertRows(w.up, lay.d_model, r, 1, lay.dtype,
                                base + lay.up_offset() + r * DTypeRowBytes(lay.dtype, lay.d_model),
                                sc);
            } else {
              r -= lay.width;
              bad = ConvertRows(w.down, lay.width, r, 1, lay.dtype,
                                base + lay.down_offset() + r * DTypeRowBytes(lay.dtype, lay.width),
                                sc);
            }
            if (bad >= 0) bad_row.store(static_cast<int64_t>(i));
          }
        });
        if (const int64_t i = bad_row.load(); i >= 0) {
          int64_t row = i % rows_per_expert;  // gate rows, then up rows, then down rows
          ExpertMatrix m = ExpertMatrix::kGate;
          if (row >= lay.width) {
            row -= lay.width;
            m = ExpertMatrix::kUp;
          }
          if (row >= lay.width) {
            row -= lay.width;
            m = ExpertMatrix::kDown;
          }
          const std::string name = s.spec->expert_tensor_name(b.layer, e0 + i / rows_per_expert, m);
          return Bf16cRowError(src_bank != nullptr ? s.converted->description() : src.FileOf(name),
                               name, row, true);
        }
        for (int64_t i = 0; i < n; ++i)  // zero each expert's padding up to the stride
          std::memset(
              chunk.data() + static_cast<size_t>(i) * lay.stride_bytes() + lay.expert_bytes(), 0,
              lay.stride_bytes() - lay.expert_bytes());
        hash.Update(chunk.data(), chunk.size());
        MT_RETURN_IF_ERROR(out.Write(chunk.data(), chunk.size()));
        done += static_cast<uint64_t>(n) * in.stride_bytes();
        progress.Update(done, "layer " + std::to_string(b.layer));
      }
      b.xxh64 = hash.Digest();
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
  sum.n_dense_converted = n_dense_converted;
  sum.expert_dtype = lay.dtype;
  return sum;
}

}  // namespace moetier
