#include "model/dense_packing.h"

#include <atomic>
#include <map>

#include "experts/host_bank.h"
#include "kernels/cpu/bf16c.h"

namespace moetier {

namespace {

// The input store, with some of its matrices replaced by packed copies it owns.
class PackedStore final : public TensorStore {
 public:
  explicit PackedStore(std::unique_ptr<TensorStore> base) : base_(std::move(base)) {}

  void Add(const std::string& name, TensorView view, HostBank storage) {
    packed_[name] = std::move(view);
    storage_.push_back(std::move(storage));
  }
  const TensorView* Find(const std::string& name) const override {
    auto it = packed_.find(name);
    return it != packed_.end() ? &it->second : base_->Find(name);
  }
  std::string FileOf(const std::string& name) const override { return base_->FileOf(name); }
  const std::string& description() const override { return base_->description(); }
  std::vector<std::string> Names() const override { return base_->Names(); }

 private:
  std::unique_ptr<TensorStore> base_;
  std::map<std::string, TensorView> packed_;
  std::vector<HostBank> storage_;  // the packed bytes, one buffer per matrix
};

}  // namespace

Expected<DensePacking> PackDenseWeights(std::unique_ptr<TensorStore> dense,
                                        const std::set<std::string>& keep, WeightPacking packing,
                                        ThreadPool& pool) {
  auto store = std::make_unique<PackedStore>(std::move(dense));
  const TensorStore& base = *store;  // finds the input's views: nothing is packed yet
  DensePacking out;
  for (const std::string& name : base.Names()) {
    const TensorView* v = base.Find(name);
    if (v == nullptr || v->shape.size() != 2 || keep.count(name) > 0) continue;
    const int64_t rows = v->shape[0], k = v->shape[1];
    const DType to = CpuMatrixDType(v->dtype, k, packing);
    if (to != DType::kBF16C) continue;
    const uint64_t row_bytes = DTypeRowBytes(to, k);
    MT_ASSIGN_OR_RETURN(HostBank buf, HostBank::Allocate(row_bytes * static_cast<uint64_t>(rows)));
    std::atomic<int64_t> bad_row{-1};
    const auto* bits = static_cast<const uint16_t*>(v->data);
    pool.ParallelFor(static_cast<size_t>(rows), [&](size_t begin, size_t end, int) {
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
    if (bad_row.load() >= 0) {
      out.warnings.push_back(
          base.FileOf(name) + ": tensor '" + name + "' row " + std::to_string(bad_row.load()) +
          " does not pack as bf16c (more than " + std::to_string(kernels::kBf16cMaxExceptions) +
          " rare high bytes); it stays " + std::string(DTypeName(v->dtype)));
      continue;
    }
    out.bytes_before += v->n_bytes;
    out.bytes_after += buf.size();
    ++out.n_packed;
    TensorView packed{to, v->shape, buf.data(), buf.size()};
    store->Add(name, std::move(packed), std::move(buf));
  }
  out.store = std::move(store);
  return out;
}

}  // namespace moetier
