#include "model/convert.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "core/log.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/bank_index.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"
#include "model/convert_output.h"
#include "model/decoder_lm.h"
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

  // Positions the next item of n_bytes: a new file if this one would exceed the shard size.
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

// The message for a row BF16C cannot hold; `row` says which ("row 3", "expert 5 row 3").
Status Bf16cRowError(const std::string& file, const std::string& name, const std::string& row,
                     bool expert) {
  return Status::Error(file + ": tensor '" + name + "' " + row + " has more than " +
                       std::to_string(kernels::kBf16cMaxExceptions) +
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

// ---------------------------------------------------------------------------------------------
// What is converted: checked from the headers, before anything is written.

Status CheckTargetDTypes(const ConvertOptions& options) {
  for (const std::optional<DType> d :
       {std::optional<DType>(options.expert_dtype), options.dense_dtype})
    if (d && *d != DType::kBF16 && !IsBlockFormat(*d))
      return Status::Error("convert: cannot store weights as " + std::string(DTypeName(*d)) +
                           "; choose bf16, bf16c, q8_0 or q4_0");
  return OkStatus();
}

// The experts' rows must fit the dtype written (`lay`), and quantized source experts can only be
// copied into their own dtype (to re-encode the dense matrices or re-shard): never quantized
// twice.
Status CheckExpertTarget(const ModelSource& s, const ExpertLayout& lay) {
  if (s.banks.empty()) return OkStatus();
  const TensorStore& src = s.dense();
  if (!lay.valid()) {
    // Named by the first matrix whose rows do not fit.
    const bool gate = !IsValidRowLength(lay.dtype, lay.d_model);
    const std::string name = s.spec->expert_tensor_name(
        s.banks[0].layer, 0, gate ? ExpertMatrix::kGate : ExpertMatrix::kDown);
    return Status::Error(src.FileOf(name) + ": expert tensor '" + name + "' has rows of " +
                         std::to_string(gate ? lay.d_model : lay.width) + " elements (" +
                         (gate ? "hidden_size" : "the expert width") +
                         "), not a multiple of 32, so it cannot be stored as " +
                         std::string(DTypeName(lay.dtype)) + "; use --dtype bf16");
  }
  const DType in = s.layout.dtype;
  if (!IsFloatDType(in) && in != lay.dtype)
    return Status::Error(src.description() + ": experts are " + std::string(DTypeName(in)) +
                         "; convert re-encodes BF16, F16 or F32 experts and copies quantized "
                         "ones as they are (--dtype " +
                         std::string(DTypeName(in)) + "); for " +
                         std::string(DTypeName(lay.dtype)) +
                         " convert from the Hugging Face checkpoint or a bf16 conversion of it");
  return OkStatus();
}

// Checks every tensor the loader reads as the loader checks it (presence, dtype, shape): the
// dense ones through the architecture's own list (ArchSpec::bind_dense), a checkpoint's experts
// through CheckpointExperts (a converted source's banks were checked against config.json when
// it was opened). Returns the names of the dense tensors the architecture reads.
Expected<std::set<std::string>> CheckLoadable(const ModelSource& s) {
  WeightBinder binder(s.dense(), s.config);
  s.spec->bind_dense(s.config, binder);
  MT_RETURN_IF_ERROR(binder.status());
  if (s.hf)
    for (const LayerBank& b : s.banks) MT_RETURN_IF_ERROR(CheckpointExperts(s, b.layer).status());
  return binder.requested();
}

// A buffer that older checkpoints saved though the model recomputes it from config.json (a
// rotary embedding's inverse frequencies, from rope_theta and head_dim). It carries no weight,
// so it is dropped with a warning rather than refused: refusing would turn away checkpoints
// that load and run correctly everywhere else.
bool IsDerivedBuffer(const std::string& name) {
  return name.ends_with(".rotary_emb.inv_freq");
}

// The source's dense tensors that the output keeps: those the architecture reads (`read`). Any
// other tensor that is not a routed expert of a bank — an expert past the config's count, a
// layer past num_hidden_layers, an unknown name — means config.json and the weights disagree,
// and is refused rather than dropped: the loader would ignore it, so a conversion that kept or
// dropped it silently would hide a config that describes another model.
Expected<std::vector<std::string>> KeptDenseNames(const ModelSource& s,
                                                  const std::set<std::string>& read) {
  const TensorStore& src = s.dense();
  const std::set<std::string> experts = ExpertTensorNames(s);
  std::vector<std::string> kept;
  for (const std::string& name : src.Names()) {
    if (read.count(name)) {
      kept.push_back(name);
    } else if (IsDerivedBuffer(name)) {
      LogWarn(src.FileOf(name) + ": tensor '" + name +
              "' is recomputed from config.json when the model loads; not converted");
    } else if (!experts.count(name)) {
      return Status::Error(src.FileOf(name) + ": tensor '" + name + "' is not part of the " +
                           s.config.architecture + " that " + s.config.source + " describes (" +
                           std::to_string(s.config.n_layers) + " layers, " +
                           std::to_string(s.config.n_experts) +
                           " experts); fix config.json or remove the tensor");
    }
  }
  return kept;
}

// Dense tensors are re-encoded only from float: a quantized tensor of a converted source can
// only be copied, since re-encoding it would quantize twice (and the index would claim a dtype
// it does not have).
Status CheckDenseTargets(const ModelSource& s, const std::vector<std::string>& kept,
                         const ConvertOptions& options, const std::set<std::string>& routers) {
  if (!options.dense_dtype) return OkStatus();
  const TensorStore& src = s.dense();
  for (const std::string& name : kept) {
    const TensorView* v = src.Find(name);
    if (IsFloatDType(v->dtype) || *options.dense_dtype == v->dtype || v->shape.size() != 2 ||
        routers.count(name))
      continue;
    return Status::Error(src.FileOf(name) + ": tensor '" + name + "' is already " +
                         std::string(DTypeName(v->dtype)) + " and cannot be re-encoded as " +
                         std::string(DTypeName(*options.dense_dtype)) +
                         " (that would quantize it twice): pass --dense-dtype same, or "
                         "convert from the Hugging Face checkpoint");
  }
  return OkStatus();
}

// The layer a dense tensor belongs to ("model.layers.<n>."), or -1 for the others (embeddings,
// final norm, lm_head).
int64_t LayerOf(const std::string& name, int64_t n_layers) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  const int64_t layer = std::strtoll(name.c_str() + kPrefix.size(), nullptr, 10);
  return layer >= 0 && layer < n_layers ? layer : -1;
}

// What a conversion writes, decided before anything is written.
struct ConvertPlan {
  ExpertLayout out_layout;           // the banks written
  std::optional<DType> dense_dtype;  // what the index records as convert's dense choice
  std::set<std::string> routers;     // kept in their source dtype
  // Dense tensors by the layer they belong to ([0]: none), so the output streams layer by
  // layer: each layer's dense weights, then its bank.
  std::vector<std::vector<std::string>> dense_by_layer;
  uint64_t total_bytes = 0;  // source bytes read: what progress counts
};

Expected<ConvertPlan> PlanConversion(const ModelSource& s, const ConvertOptions& options) {
  ConvertPlan p;
  p.out_layout = ExpertLayout{s.layout.d_model, s.layout.width, options.expert_dtype};
  MT_RETURN_IF_ERROR(CheckExpertTarget(s, p.out_layout));
  MT_ASSIGN_OR_RETURN(const std::set<std::string> read, CheckLoadable(s));
  MT_ASSIGN_OR_RETURN(const std::vector<std::string> kept, KeptDenseNames(s, read));
  p.routers = RouterTensorNames(s);
  MT_RETURN_IF_ERROR(CheckDenseTargets(s, kept, options, p.routers));
  // With --dense-dtype same, what a converted source recorded stays true of the output.
  p.dense_dtype =
      options.dense_dtype || !s.converted ? options.dense_dtype : s.converted->index().dense_dtype;
  p.dense_by_layer.resize(static_cast<size_t>(s.config.n_layers + 1));
  for (const std::string& name : kept) {
    p.dense_by_layer[static_cast<size_t>(LayerOf(name, s.config.n_layers) + 1)].push_back(name);
    p.total_bytes += s.dense().Find(name)->n_bytes;
  }
  for (const LayerBank& b : s.banks) p.total_bytes += b.bytes;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Writing.

// Where row r of an expert sits, in the order convert writes them: gate's width rows, up's
// width rows, then down's d_model rows.
struct ExpertRow {
  ExpertMatrix matrix;
  int64_t row;
};
ExpertRow LocateExpertRow(const ExpertLayout& lay, int64_t r) {
  if (r < lay.width) return {ExpertMatrix::kGate, r};
  if (r < 2 * lay.width) return {ExpertMatrix::kUp, r - lay.width};
  return {ExpertMatrix::kDown, r - 2 * lay.width};
}

// Converts row r (LocateExpertRow) of expert `w` into the expert's bytes at `expert_out`, laid
// out as `lay`. Returns ConvertRows' answer: -1, or the row BF16C cannot hold.
int64_t ConvertExpertRow(const ExpertWeights& w, const ExpertLayout& lay, int64_t r,
                         uint8_t* expert_out, float* scratch) {
  const ExpertRow at = LocateExpertRow(lay, r);
  const auto row = static_cast<size_t>(at.row);
  switch (at.matrix) {
    case ExpertMatrix::kGate:
      return ConvertRows(
          w.gate, lay.d_model, at.row, 1, lay.dtype,
          expert_out + lay.gate_offset() + row * DTypeRowBytes(lay.dtype, lay.d_model), scratch);
    case ExpertMatrix::kUp:
      return ConvertRows(w.up, lay.d_model, at.row, 1, lay.dtype,
                         expert_out + lay.up_offset() + row * DTypeRowBytes(lay.dtype, lay.d_model),
                         scratch);
    default:
      return ConvertRows(w.down, lay.width, at.row, 1, lay.dtype,
                         expert_out + lay.down_offset() + row * DTypeRowBytes(lay.dtype, lay.width),
                         scratch);
  }
}

// Writes a planned conversion's weights into a directory, layer by layer (each layer's dense
// tensors, then its bank), and returns the index that describes them. The steps share the
// threads' scratch rows, one chunk buffer and the progress line; each checks for cancellation
// before it starts.
class WeightWriter {
 public:
  WeightWriter(const ModelSource& s, const ConvertPlan& plan, const ConvertOptions& options,
               const fs::path& dir, ThreadPool& pool)
      : s_(s),
        src_(s.dense()),
        plan_(plan),
        options_(options),
        in_(s.layout),
        lay_(plan.out_layout),
        out_(dir, options.shard_bytes),
        pool_(pool),
        scratch_(static_cast<size_t>(pool.size())),
        progress_("converting", plan.total_bytes) {}

  Expected<BankIndex> Run();
  int n_dense_converted() const { return n_dense_converted_; }

 private:
  Status CheckCancelled() const;
  void Advance(uint64_t source_bytes, const std::string& detail);
  Status WriteDense(const std::string& name);
  Status CopyTensor(const std::string& name, const TensorView& v);
  Status ConvertTensor(const std::string& name, const TensorView& v, DType to);
  Status WriteBank(const LayerBank& lb);
  Expected<std::vector<ExpertWeights>> SourceExperts(int64_t layer) const;
  int64_t ConvertExperts(const std::vector<ExpertWeights>& experts, int64_t e0, int64_t n);
  Status ExpertRowError(int64_t layer, int64_t expert, int64_t r) const;

  const ModelSource& s_;
  const TensorStore& src_;
  const ConvertPlan& plan_;
  const ConvertOptions& options_;
  const ExpertLayout& in_;   // the source's expert layout
  const ExpertLayout& lay_;  // the one written
  DataWriter out_;
  ThreadPool& pool_;
  // Per thread: one source row in float32 (each step sizes them for its rows).
  std::vector<std::vector<float>> scratch_;
  std::vector<uint8_t> chunk_;  // one parallel step's output
  Progress progress_;
  uint64_t done_ = 0;
  BankIndex index_;
  int n_dense_converted_ = 0;
};

Expected<BankIndex> WeightWriter::Run() {
  index_.architecture = s_.config.architecture;
  index_.expert_dtype = lay_.dtype;
  index_.dense_dtype = plan_.dense_dtype;
  size_t next_bank = 0;
  for (int64_t layer = -1; layer < s_.config.n_layers; ++layer) {
    for (const std::string& name : plan_.dense_by_layer[static_cast<size_t>(layer + 1)])
      MT_RETURN_IF_ERROR(WriteDense(name));
    if (next_bank < s_.banks.size() && s_.banks[next_bank].layer == layer)
      MT_RETURN_IF_ERROR(WriteBank(s_.banks[next_bank++]));
  }
  MT_RETURN_IF_ERROR(out_.Finish());
  progress_.Finish();
  index_.files = out_.files();
  return std::move(index_);
}

Status WeightWriter::CheckCancelled() const {
  if (options_.cancel != nullptr && options_.cancel->load(std::memory_order_relaxed))
    return Status::Error("convert: interrupted; the partial output was removed");
  return OkStatus();
}

void WeightWriter::Advance(uint64_t source_bytes, const std::string& detail) {
  done_ += source_bytes;
  progress_.Update(done_, detail);
}

Status WeightWriter::WriteDense(const std::string& name) {
  MT_RETURN_IF_ERROR(CheckCancelled());
  const TensorView& v = *src_.Find(name);
  const DType to = DenseTarget(name, v, options_.dense_dtype, plan_.routers);
  if (to == v.dtype) return CopyTensor(name, v);
  MT_RETURN_IF_ERROR(ConvertTensor(name, v, to));
  ++n_dense_converted_;
  return OkStatus();
}

// As in the source: straight from its map.
Status WeightWriter::CopyTensor(const std::string& name, const TensorView& v) {
  BankIndexTensor t{name, v.dtype, v.shape, 0, 0, v.n_bytes, XXH64(v.data, v.n_bytes, 0)};
  MT_RETURN_IF_ERROR(out_.Begin(v.n_bytes, &t.file, &t.offset));
  MT_RETURN_IF_ERROR(out_.Write(v.data, v.n_bytes));
  index_.tensors.push_back(std::move(t));
  Advance(v.n_bytes, name);
  return OkStatus();
}

// A [rows, k] matrix as `to`, in chunks of rows, each chunk's rows shared among the threads.
Status WeightWriter::ConvertTensor(const std::string& name, const TensorView& v, DType to) {
  const int64_t rows = v.shape[0], k = v.shape[1];
  const size_t out_row = DTypeRowBytes(to, k);
  const size_t in_row = v.n_bytes / static_cast<size_t>(std::max<int64_t>(rows, 1));
  BankIndexTensor t{name, to, v.shape, 0, 0, static_cast<uint64_t>(rows) * out_row, 0};
  MT_RETURN_IF_ERROR(out_.Begin(t.bytes, &t.file, &t.offset));
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / std::max<size_t>(out_row, 1)));
  for (auto& sc : scratch_) sc.resize(static_cast<size_t>(k));
  Hasher hash;
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
    MT_RETURN_IF_ERROR(CheckCancelled());
    const int64_t n = std::min(rows_per_chunk, rows - r0);
    chunk_.resize(static_cast<size_t>(n) * out_row);
    std::atomic<int64_t> bad_row{-1};
    pool_.ParallelFor(static_cast<size_t>(n), [&](size_t b, size_t e, int thread) {
      const int64_t bad =
          ConvertRows(v, k, r0 + static_cast<int64_t>(b), static_cast<int64_t>(e - b), to,
                      chunk_.data() + b * out_row, scratch_[static_cast<size_t>(thread)].data());
      if (bad >= 0) bad_row.store(bad);
    });
    if (bad_row.load() >= 0)
      return Bf16cRowError(src_.FileOf(name), name, "row " + std::to_string(bad_row), false);
    hash.Update(chunk_.data(), chunk_.size());
    MT_RETURN_IF_ERROR(out_.Write(chunk_.data(), chunk_.size()));
    Advance(static_cast<uint64_t>(n) * in_row, name);
  }
  t.xxh64 = hash.Digest();
  index_.tensors.push_back(std::move(t));
  return OkStatus();
}

// Views of `layer`'s experts in the source: the checkpoint's tensors, or a converted source's
// bank once its checksum matches.
Expected<std::vector<ExpertWeights>> WeightWriter::SourceExperts(int64_t layer) const {
  if (s_.hf) return CheckpointExperts(s_, layer);
  MT_ASSIGN_OR_RETURN(const uint8_t* bank, VerifiedSourceBank(*s_.converted, layer));
  std::vector<ExpertWeights> experts;
  for (int64_t e = 0; e < s_.config.n_experts; ++e) experts.push_back(in_.Views(bank, e));
  return experts;
}

// Converts experts [e0, e0 + n) into chunk_, every row of them shared among the threads, and
// zeroes each expert's padding up to the stride. Returns -1, or the index (among the chunk's
// rows, n × (2 width + d_model)) of a row BF16C cannot hold.
int64_t WeightWriter::ConvertExperts(const std::vector<ExpertWeights>& experts, int64_t e0,
                                     int64_t n) {
  const int64_t rows_per_expert = 2 * lay_.width + lay_.d_model;
  const size_t stride = lay_.stride_bytes();
  chunk_.resize(static_cast<size_t>(n) * stride);
  std::atomic<int64_t> bad_row{-1};
  pool_.ParallelFor(static_cast<size_t>(n * rows_per_expert), [&](size_t b, size_t e, int thread) {
    float* sc = scratch_[static_cast<size_t>(thread)].data();
    for (size_t i = b; i < e; ++i) {
      const int64_t x = static_cast<int64_t>(i) / rows_per_expert;
      const int64_t r = static_cast<int64_t>(i) % rows_per_expert;
      uint8_t* base = chunk_.data() + static_cast<size_t>(x) * stride;
      if (ConvertExpertRow(experts[static_cast<size_t>(e0 + x)], lay_, r, base, sc) >= 0)
        bad_row.store(static_cast<int64_t>(i));
    }
  });
  for (int64_t x = 0; x < n; ++x)
    std::memset(chunk_.data() + static_cast<size_t>(x) * stride + lay_.expert_bytes(), 0,
                stride - lay_.expert_bytes());
  return bad_row.load();
}

Status WeightWriter::ExpertRowError(int64_t layer, int64_t expert, int64_t r) const {
  const ExpertRow at = LocateExpertRow(lay_, r);
  const ExpertTensorBinding t = s_.spec->expert_tensor(layer, expert, at.matrix);
  // A tensor stacking the layer's experts holds the row in the expert's slice.
  const std::string row = (t.stacked() ? "expert " + std::to_string(t.stacked_expert) + " " : "") +
                          "row " + std::to_string(at.row);
  return Bf16cRowError(s_.converted ? s_.converted->description() : src_.FileOf(t.name), t.name,
                       row, true);
}

// One MoE layer's bank, a chunk of experts at a time: each chunk converted by every thread,
// then hashed and written in order.
Status WeightWriter::WriteBank(const LayerBank& lb) {
  MT_RETURN_IF_ERROR(CheckCancelled());
  BankIndexBank b;
  b.layer = lb.layer;
  b.n_experts = s_.config.n_experts;
  b.bytes = lay_.bank_bytes(b.n_experts);
  b.width = lay_.width;
  b.d_model = lay_.d_model;
  b.dtype = lay_.dtype;
  b.expert_stride_bytes = lay_.stride_bytes();
  MT_ASSIGN_OR_RETURN(const std::vector<ExpertWeights> experts, SourceExperts(b.layer));
  MT_RETURN_IF_ERROR(out_.Begin(b.bytes, &b.file, &b.offset));
  for (auto& sc : scratch_) sc.resize(static_cast<size_t>(std::max(lay_.d_model, lay_.width)));
  const int64_t per_chunk = std::max<int64_t>(
      1, static_cast<int64_t>(kChunkBytes / std::max<uint64_t>(lay_.stride_bytes(), 1)));
  const int64_t rows_per_expert = 2 * lay_.width + lay_.d_model;
  Hasher hash;
  for (int64_t e0 = 0; e0 < b.n_experts; e0 += per_chunk) {
    MT_RETURN_IF_ERROR(CheckCancelled());
    const int64_t n = std::min(per_chunk, b.n_experts - e0);
    if (const int64_t i = ConvertExperts(experts, e0, n); i >= 0)
      return ExpertRowError(b.layer, e0 + i / rows_per_expert, i % rows_per_expert);
    hash.Update(chunk_.data(), chunk_.size());
    MT_RETURN_IF_ERROR(out_.Write(chunk_.data(), chunk_.size()));
    Advance(static_cast<uint64_t>(n) * in_.stride_bytes(), "layer " + std::to_string(b.layer));
  }
  b.xxh64 = hash.Digest();
  index_.banks.push_back(b);
  return OkStatus();
}

// Copies the files beside the weights (tokenizer, templates, configs) into `dir`.
Status CopySideFiles(const fs::path& model_dir, const fs::path& dir) {
  MT_ASSIGN_OR_RETURN(const std::vector<fs::path> entries,
                      ListDirectory(model_dir, "--model " + model_dir.string()));
  for (const fs::path& p : entries) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec) || !IsSideFile(p)) continue;
    const fs::path dst = dir / p.filename();
    fs::copy_file(p, dst, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::Error(p.string() + ": cannot copy into --out: " + ec.message());
    // Owner-writable whatever the source's mode (a read-only snapshot), so the converted
    // directory's config can be edited like any other.
    fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add, ec);
  }
  return OkStatus();
}

// Writes the index into `dir`, synced: written after the synced data files, an index on disk
// always describes complete files.
Status WriteIndex(const BankIndex& index, const fs::path& dir) {
  const fs::path path = dir / kBankIndexFileName;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr)
    return Status::Error(path.string() + ": cannot create: " + std::strerror(errno));
  const std::string text = SerializeBankIndex(index);
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  if (std::fclose(f) != 0 || !ok)
    return Status::Error(path.string() + ": write failed: " + std::strerror(errno));
  return OkStatus();
}

ConvertSummary Summarize(const BankIndex& index, int n_dense_converted, DType expert_dtype) {
  ConvertSummary sum;
  for (const auto& f : index.files) sum.bytes_written += f.bytes;
  sum.n_files = static_cast<int>(index.files.size());
  sum.n_banks = static_cast<int>(index.banks.size());
  sum.n_tensors = static_cast<int>(index.tensors.size());
  sum.n_dense_converted = n_dense_converted;
  sum.expert_dtype = expert_dtype;
  return sum;
}

// The conversion, in its steps. Everything up to the staging directory reads headers only (and
// the few norms the architecture binds), so a refused model or --out costs no time and leaves
// nothing; from there every failure ends in ~StagingDir.
Expected<ConvertSummary> Convert(const fs::path& model_dir, const fs::path& out_dir,
                                 const ConvertOptions& options) {
  MT_RETURN_IF_ERROR(CheckTargetDTypes(options));
  MT_ASSIGN_OR_RETURN(ModelSource s, OpenModelSource(model_dir));
  MT_ASSIGN_OR_RETURN(OutputTarget target, ResolveOutput(out_dir, model_dir, options.overwrite));
  MT_ASSIGN_OR_RETURN(const ConvertPlan plan, PlanConversion(s, options));
  // A converted source's dense tensors are checked against its index now; each bank is checked
  // as it is read.
  if (s.converted) MT_RETURN_IF_ERROR(s.converted->VerifyDenseChecksums());
  ThreadPool pool(options.n_threads);  // before anything is written: a pool that fails leaves none
  StagingDir staging(std::move(target));
  MT_RETURN_IF_ERROR(staging.Create());
  WeightWriter writer(s, plan, options, staging.path(), pool);
  MT_ASSIGN_OR_RETURN(const BankIndex index, writer.Run());
  MT_RETURN_IF_ERROR(CopySideFiles(model_dir, staging.path()));
  MT_RETURN_IF_ERROR(WriteIndex(index, staging.path()));
  MT_RETURN_IF_ERROR(staging.Publish());
  return Summarize(index, writer.n_dense_converted(), plan.out_layout.dtype);
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
  // The steps report failures as Status; this turns anything thrown below them (an allocation,
  // a thread that cannot start) into one too. The staging directory is gone by then.
  const std::string where = "convert --model " + hf_dir.string() + " --out " + out_dir.string();
  try {
    return Convert(hf_dir, out_dir, options);
  } catch (const std::exception& e) {
    return Status::Error(where + ": " + e.what() + "; --out was left as it was");
  } catch (...) {
    return Status::Error(where + ": unexpected failure; --out was left as it was");
  }
}

}  // namespace moetier
