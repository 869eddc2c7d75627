#include "model/dense_holding.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "experts/host_bank.h"
#include "kernels/cpu/bf16c.h"

namespace moetier {

namespace {

// The input store, with some of its matrices replaced by copies it owns.
class HeldStore final : public TensorStore {
 public:
  explicit HeldStore(std::unique_ptr<TensorStore> base) : base_(std::move(base)) {}

  void Add(const std::string& name, TensorView view, HostBank storage) {
    held_[name] = std::move(view);
    storage_.push_back(std::move(storage));
  }
  const TensorView* Find(const std::string& name) const override {
    auto it = held_.find(name);
    return it != held_.end() ? &it->second : base_->Find(name);
  }
  std::string FileOf(const std::string& name) const override { return base_->FileOf(name); }
  const std::string& description() const override { return base_->description(); }
  std::vector<std::string> Names() const override { return base_->Names(); }

 private:
  std::unique_ptr<TensorStore> base_;
  std::map<std::string, TensorView> held_;
  std::vector<HostBank> storage_;  // the held bytes, one buffer per matrix
};

// Packs `v` as BF16C into `buf` with `pool`: the first row that does not pack, or -1.
int64_t PackMatrix(const TensorView& v, HostBank& buf, ThreadPool& pool) {
  const int64_t k = v.shape[1];
  const uint64_t row_bytes = DTypeRowBytes(DType::kBF16C, k);
  std::atomic<int64_t> bad_row{-1};
  const auto* bits = static_cast<const uint16_t*>(v.data);
  pool.ParallelFor(static_cast<size_t>(v.shape[0]), [&](size_t begin, size_t end, int) {
    const int64_t bad = kernels::PackRowsBf16c(bits + begin * static_cast<size_t>(k),
                                               static_cast<int64_t>(end - begin), k,
                                               buf.data() + begin * row_bytes);
    if (bad < 0) return;
    // The lowest bad row of any range, so the warning names the matrix's first.
    const int64_t row = static_cast<int64_t>(begin) + bad;
    int64_t seen = bad_row.load();
    while ((seen < 0 || row < seen) && !bad_row.compare_exchange_weak(seen, row)) {
    }
  });
  return bad_row.load();
}

// Copies `n` bytes with `pool`, a slice per thread (one core does not reach the read bandwidth).
void ParallelCopy(uint8_t* dst, const uint8_t* src, size_t n, ThreadPool& pool) {
  constexpr size_t kSlice = 1 << 20;
  const size_t n_slices = (n + kSlice - 1) / kSlice;
  pool.ParallelFor(n_slices, [&](size_t begin, size_t end, int) {
    const size_t a = begin * kSlice, b = std::min(n, end * kSlice);
    std::memcpy(dst + a, src + a, b - a);
  });
}

}  // namespace

Expected<DenseMemory> ParseDenseMemory(const std::string& text) {
  for (DenseMemory m : {DenseMemory::kAuto, DenseMemory::kCopy, DenseMemory::kMapped})
    if (text == DenseMemoryName(m)) return m;
  return Status::Error("--dense-memory: '" + text + "' is not one of auto, copy, mapped");
}

std::string_view DenseMemoryName(DenseMemory m) {
  switch (m) {
    case DenseMemory::kAuto:
      return "auto";
    case DenseMemory::kCopy:
      return "copy";
    case DenseMemory::kMapped:
      return "mapped";
  }
  return "?";
}

bool CopiesDense(DenseMemory m, uint64_t copy_bytes, uint64_t available_bytes) {
  switch (m) {
    case DenseMemory::kCopy:
      return true;
    case DenseMemory::kMapped:
      return false;
    case DenseMemory::kAuto:
      break;
  }
  return available_bytes >= copy_bytes && available_bytes - copy_bytes >= kDenseCopyMinFreeBytes;
}

Expected<DenseHolding> HoldDenseWeights(std::unique_ptr<TensorStore> dense,
                                        const DenseHoldingOptions& o, ThreadPool& pool) {
  auto store = std::make_unique<HeldStore>(std::move(dense));
  const TensorStore& base = *store;  // finds the input's views: nothing is held yet
  // What each matrix would be held as, and what copying the rest would cost.
  struct Plan {
    std::string name;
    const TensorView* view;
    bool pack;
  };
  std::vector<Plan> plans;
  uint64_t copy_bytes = 0;
  for (const std::string& name : base.Names()) {
    const TensorView* v = base.Find(name);
    if (v == nullptr || v->shape.size() != 2 || o.skip.count(name) > 0) continue;
    const bool pack = o.keep_dtype.count(name) == 0 &&
                      CpuMatrixDType(v->dtype, v->shape[1], o.packing) == DType::kBF16C;
    if (!pack && o.gathered.count(name) > 0) continue;
    if (!pack) copy_bytes += v->n_bytes;
    plans.push_back({name, v, pack});
  }
  DenseHolding out;
  out.copies = CopiesDense(o.memory, copy_bytes, o.available_bytes);
  for (const Plan& p : plans) {
    const TensorView& v = *p.view;
    if (p.pack) {
      const uint64_t bytes = DTypeRowBytes(DType::kBF16C, v.shape[1]) * v.shape[0];
      MT_ASSIGN_OR_RETURN(HostBank buf, HostBank::Allocate(bytes));
      const int64_t bad_row = PackMatrix(v, buf, pool);
      if (bad_row < 0) {
        out.bytes_before += v.n_bytes;
        out.bytes_after += buf.size();
        ++out.n_packed;
        TensorView packed{DType::kBF16C, v.shape, buf.data(), buf.size()};
        store->Add(p.name, std::move(packed), std::move(buf));
        continue;
      }
      out.warnings.push_back(base.FileOf(p.name) + ": tensor '" + p.name + "' row " +
                             std::to_string(bad_row) + " does not pack as bf16c (more than " +
                             std::to_string(kernels::kBf16cMaxExceptions) +
                             " rare high bytes); it stays " + std::string(DTypeName(v.dtype)));
      if (o.gathered.count(p.name) > 0) continue;
    }
    if (!out.copies) continue;
    MT_ASSIGN_OR_RETURN(HostBank buf, HostBank::Allocate(v.n_bytes));
    ParallelCopy(buf.data(), v.bytes(), v.n_bytes, pool);
    out.copied_bytes += v.n_bytes;
    ++out.n_copied;
    TensorView copy{v.dtype, v.shape, buf.data(), v.n_bytes};
    store->Add(p.name, std::move(copy), std::move(buf));
  }
  out.store = std::move(store);
  return out;
}

}  // namespace moetier
