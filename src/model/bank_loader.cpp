#include "model/bank_loader.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/progress.h"
#include "experts/settle.h"
#include "io/converted_model.h"
#include "model/bank_packing.h"

namespace moetier {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Copies experts (views into a checkpoint) into `bank`, in layout `lay`.
void CopyExperts(const std::vector<ExpertWeights>& src, const ExpertLayout& lay, HostBank& bank,
                 ThreadPool& pool) {
  pool.ParallelFor(src.size(), [&](size_t begin, size_t end, int) {
    for (size_t e = begin; e < end; ++e) {
      uint8_t* dst = bank.data() + e * lay.stride_bytes();
      std::memcpy(dst + lay.gate_offset(), src[e].gate.data, lay.gate_up_bytes());
      std::memcpy(dst + lay.up_offset(), src[e].up.data, lay.gate_up_bytes());
      std::memcpy(dst + lay.down_offset(), src[e].down.data, lay.down_bytes());
    }
  });
}

// The bank's xxh64 against the index; the error names the file and says what to do.
Status VerifyBank(const ModelSource& s, size_t i, const HostBank& bank, int64_t layer) {
  const BankIndexBank& b = s.converted->index().banks[i];
  const uint64_t got = Checksum64(bank.data(), bank.size());
  if (got == b.xxh64) return OkStatus();
  return Status::Error(s.converted->FilePath(b.file).string() +
                       ": checksum mismatch in the expert bank of layer " + std::to_string(layer) +
                       " (xxh64 " + Hex64(got) + ", index says " + Hex64(b.xxh64) +
                       "); the file is corrupt: re-run moetier convert");
}

// The second stage of loading, on its own thread, bank after bank in order: the checksum, the
// packing of banks the plan holds in another format than stored, and settling (pin / lock). It
// runs while the reading threads read the next banks, so packing and pinning overlap the reads.
//
// A packed bank's stored bytes are read into one of kStagingBuffers reusable buffers, one bank
// (as stored) each: the reads fill one while this thread packs out of the other. The
// buffers are the transient cost of packing: the peak is 0.77 n + 2 banks for n bf16 layers,
// below holding them as stored from n = 9 on (an 8-layer model peaks 2 % above it).
class Finisher {
 public:
  static constexpr size_t kStagingBuffers = 2;

  Finisher(const ModelSource& s, const ResidencyPlan& plan, const BankLoadOptions& opts,
           ThreadPool& pool, std::vector<HostBank>& banks, std::vector<ExpertLayout>& layouts,
           std::vector<CpuCopy>& copies, std::vector<LayerResidency>& settled)
      : s_(s),
        plan_(plan),
        opts_(opts),
        pool_(pool),
        banks_(banks),
        layouts_(layouts),
        copies_(copies),
        settled_(settled),
        thread_([this] { Run(); }) {}
  ~Finisher() { Finish(); }

  // A free staging buffer of n_bytes (waits for one), or the error that stopped this
  // thread.
  Expected<HostBank*> AcquireStaging(size_t n_bytes) {
    size_t k = 0;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return !status_.ok() || n_busy_ < kStagingBuffers; });
      if (!status_.ok()) return status_;
      while (busy_[k]) ++k;
      busy_[k] = true;
      ++n_busy_;
    }
    HostBank& b = staging_[k];
    if (b.size() != n_bytes) {  // (every bank of a model has one size: allocated once)
      b = HostBank();
      MT_ASSIGN_OR_RETURN(b, HostBank::Allocate(n_bytes));
    }
    return &b;
  }

  // Bank i is ready: in banks[i] as stored, or in `staging` (from AcquireStaging) to be packed,
  // or — `checkpoint` non-empty — to be packed from a checkpoint's maps.
  void Submit(size_t i, HostBank* staging, std::vector<ExpertWeights> checkpoint) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back({i, staging, std::move(checkpoint)});
    }
    cv_.notify_all();
  }
  // Waits for every submitted bank; returns the first error.
  Status Finish() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  std::vector<std::string> warnings;

 private:
  struct Job {
    size_t i = 0;
    HostBank* staging = nullptr;
    std::vector<ExpertWeights> checkpoint;
  };

  void Run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      Status st = status_.ok() ? Process(job) : OkStatus();
      std::lock_guard<std::mutex> l(mu_);
      if (job.staging != nullptr) {
        const size_t k = static_cast<size_t>(job.staging - staging_);
        busy_[k] = false;
        --n_busy_;
      }
      if (status_.ok() && !st.ok()) status_ = st;
      cv_.notify_all();
    }
  }

  Status Process(Job& job) {
    const size_t i = job.i;
    const int64_t layer = plan_.layers[i].layer;
    const bool packs = job.staging != nullptr || !job.checkpoint.empty();
    HostBank& stored = job.staging != nullptr ? *job.staging : banks_[i];
    if (s_.converted && opts_.verify) MT_RETURN_IF_ERROR(VerifyBank(s_, i, stored, layer));
    if (packs) MT_RETURN_IF_ERROR(Pack(job, stored));
    const LayerResidency& planned = plan_.layers[i];
    const SettleResult r =
        SettleBank(banks_[i], layer, planned.tier, opts_.gpu_available, opts_.inject);
    settled_[i] = {layer, r.tier, banks_[i].size(), layouts_[i].dtype};
    if (!r.warning.empty()) warnings.push_back(r.warning);
    if (planned.has_cpu_copy()) MT_RETURN_IF_ERROR(MakeCpuCopy(i));
    return OkStatus();
  }

  // Bank i's experts, as stored, in `packed`'s format: Ok with an empty bank when a row does not
  // pack (the reason added to the warnings, ending with `otherwise`).
  Expected<HostBank> Packed(size_t i, const std::vector<ExpertWeights>& from,
                            const ExpertLayout& packed, const std::string& otherwise) {
    const int64_t layer = plan_.layers[i].layer;
    MT_ASSIGN_OR_RETURN(HostBank bank, HostBank::Allocate(packed.bank_bytes(s_.config.n_experts)));
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = PackExpertBank(from, packed, bank.data(), layer, pool_);
    LogDebug("bank " + std::to_string(i) + " packed in " + std::to_string(SecondsSince(t0)) + " s");
    if (st.ok()) return bank;
    warnings.push_back(st.message() + "; " + otherwise);
    return HostBank();
  }

  std::vector<ExpertWeights> StoredViews(const HostBank& stored) const {
    std::vector<ExpertWeights> views;
    for (int64_t e = 0; e < s_.config.n_experts; ++e)
      views.push_back(s_.layout.Views(stored.data(), e));
    return views;
  }

  // Bank i (as stored) packed once more for the CPU executor (the plan gives pinned layers one
  // for the CPU's share of hybrid steps; a bank that did not pin then runs on the CPU alone, from
  // this copy), and locked. Without it (a row that does not pack) the CPU reads the bank itself.
  Status MakeCpuCopy(size_t i) {
    const LayerResidency& planned = plan_.layers[i];
    const ExpertLayout packed{s_.layout.d_model, s_.layout.width, planned.cpu_copy_dtype};
    MT_ASSIGN_OR_RETURN(HostBank copy, Packed(i, StoredViews(banks_[i]), packed,
                                              "the CPU reads this layer's pinned bank"));
    if (copy.size() == 0) return OkStatus();
    const SettleResult r = SettleBank(copy, planned.layer, planned.cpu_copy_tier,
                                      opts_.gpu_available, opts_.inject, "'s CPU copy");
    if (!r.warning.empty()) warnings.push_back(r.warning);
    settled_[i].cpu_copy_bytes = copy.size();
    settled_[i].cpu_copy_dtype = packed.dtype;
    settled_[i].cpu_copy_tier = r.tier;
    copies_[i] = CpuCopy{std::move(copy), packed};
    return OkStatus();
  }

  // Packs bank i into the plan's format. A layer with a row that does not pack stays as stored,
  // with a warning: packing is an optimisation, never a reason not to load.
  Status Pack(Job& job, HostBank& stored) {
    const size_t i = job.i;
    std::vector<ExpertWeights> from = std::move(job.checkpoint);
    if (from.empty()) from = StoredViews(stored);
    const ExpertLayout packed{s_.layout.d_model, s_.layout.width, plan_.layers[i].dtype};
    MT_ASSIGN_OR_RETURN(
        HostBank bank,
        Packed(i, from, packed, "the layer stays " + std::string(DTypeName(s_.layout.dtype))));
    if (bank.size() != 0) {
      banks_[i] = std::move(bank);
      layouts_[i] = packed;
      return OkStatus();
    }
    if (job.staging != nullptr) {
      // Keep the staging buffer itself as the bank; the next AcquireStaging allocates anew.
      banks_[i] = std::move(stored);
    } else {
      MT_ASSIGN_OR_RETURN(banks_[i], HostBank::Allocate(s_.banks[i].bytes));
      CopyExperts(from, s_.layout, banks_[i], pool_);
    }
    layouts_[i] = s_.layout;
    return OkStatus();
  }

  const ModelSource& s_;
  const ResidencyPlan& plan_;
  const BankLoadOptions& opts_;
  ThreadPool& pool_;
  std::vector<HostBank>& banks_;
  std::vector<ExpertLayout>& layouts_;
  std::vector<CpuCopy>& copies_;
  std::vector<LayerResidency>& settled_;
  HostBank staging_[kStagingBuffers];
  bool busy_[kStagingBuffers] = {};
  size_t n_busy_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool done_ = false;
  Status status_;
  std::thread thread_;  // last: starts after every member above exists
};

// A converted model's banks, read as one stream (ReadFileRanges: the device's queue stays full
// from one bank to the next): bank i into banks[i], or into a staging buffer when the plan packs
// it, and handed to the finisher as soon as it and the banks before it are in.
Status ReadConvertedBanks(const ModelSource& s, const ResidencyPlan& plan,
                          const BankLoadOptions& opts, ThreadPool& io_pool, Finisher& finisher,
                          std::vector<HostBank>& banks, Progress& progress, ReadMode& mode) {
  const size_t n = s.banks.size();
  std::vector<FileRange> ranges;
  for (size_t i = 0; i < n; ++i) {
    const BankIndexBank& b = s.converted->index().banks[i];
    ranges.push_back({s.converted->FilePath(b.file), b.offset, b.bytes});
  }
  std::vector<HostBank*> staging(n, nullptr);
  std::vector<std::chrono::steady_clock::time_point> started(n);
  uint64_t read_bytes = 0;
  RangeReader reader;
  reader.chunk_bytes = opts.read_chunk_bytes;
  reader.dst = [&](size_t i) -> Expected<uint8_t*> {
    started[i] = std::chrono::steady_clock::now();
    if (plan.layers[i].dtype == s.layout.dtype) {
      MT_ASSIGN_OR_RETURN(banks[i], HostBank::Allocate(s.banks[i].bytes));
      return banks[i].data();
    }
    MT_ASSIGN_OR_RETURN(staging[i], finisher.AcquireStaging(s.banks[i].bytes));
    return staging[i]->data();
  };
  reader.done = [&](size_t i) {
    finisher.Submit(i, staging[i], {});
    LogDebug("bank " + std::to_string(i) + " read in " + std::to_string(SecondsSince(started[i])) +
             " s");
    read_bytes += s.banks[i].bytes;
    progress.Update(read_bytes, "layer " + std::to_string(s.banks[i].layer));
    return OkStatus();
  };
  return ReadFileRanges(ranges, reader, io_pool, &mode);
}

// A Hugging Face checkpoint's banks, layer after layer: copied out of its maps into banks[i], or
// handed to the finisher to pack straight from them.
Status CopyCheckpointBanks(const ModelSource& s, const ResidencyPlan& plan, ThreadPool& io_pool,
                           Finisher& finisher, std::vector<HostBank>& banks, Progress& progress) {
  uint64_t copied = 0;
  for (size_t i = 0; i < s.banks.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    MT_ASSIGN_OR_RETURN(std::vector<ExpertWeights> src, CheckpointExperts(s, s.banks[i].layer));
    if (plan.layers[i].dtype == s.layout.dtype) {
      MT_ASSIGN_OR_RETURN(banks[i], HostBank::Allocate(s.banks[i].bytes));
      CopyExperts(src, s.layout, banks[i], io_pool);
      finisher.Submit(i, nullptr, {});
    } else {
      finisher.Submit(i, nullptr, std::move(src));
    }
    LogDebug("bank " + std::to_string(i) + " read in " + std::to_string(SecondsSince(t0)) + " s");
    copied += s.banks[i].bytes;
    progress.Update(copied, "layer " + std::to_string(s.banks[i].layer));
  }
  return OkStatus();
}

}  // namespace

Expected<LoadedBanks> LoadBanks(const ModelSource& s, const ResidencyPlan& plan,
                                const BankLoadOptions& opts, ThreadPool& io_pool,
                                ThreadPool& pack_pool) {
  const size_t n = s.banks.size();
  LoadedBanks out;
  out.settled.resize(n);
  std::vector<HostBank> banks(n);
  std::vector<ExpertLayout> layouts(n, s.layout);
  std::vector<CpuCopy> copies(n);
  uint64_t total = 0;
  for (const auto& b : s.banks) total += b.bytes;
  std::string title = "loading experts";
  for (const auto& l : plan.layers)
    if (l.dtype != s.layout.dtype || l.has_cpu_copy()) {
      title += " (packing " + std::string(DTypeName(s.layout.dtype)) + " as " +
               std::string(DTypeName(l.has_cpu_copy() ? l.cpu_copy_dtype : l.dtype)) +
               (l.has_cpu_copy() ? " for the CPU" : "") + ")";
      break;
    }
  Progress progress(title, total);
  ReadMode mode = ReadMode::kDirect;
  {
    Finisher finisher(s, plan, opts, pack_pool, banks, layouts, copies, out.settled);
    MT_RETURN_IF_ERROR(
        s.converted ? ReadConvertedBanks(s, plan, opts, io_pool, finisher, banks, progress, mode)
                    : CopyCheckpointBanks(s, plan, io_pool, finisher, banks, progress));
    MT_RETURN_IF_ERROR(finisher.Finish());
    out.warnings = std::move(finisher.warnings);
  }
  progress.Finish();
  out.read_mode = !s.converted ? "mmap" : mode == ReadMode::kDirect ? "o_direct" : "buffered";
  std::vector<int64_t> layers;
  for (const auto& b : s.banks) layers.push_back(b.layer);
  out.experts =
      std::make_unique<BankedExperts>(s.config.n_layers, std::move(layers), std::move(banks),
                                      std::move(layouts), s.config.n_experts, std::move(copies));
  return out;
}

}  // namespace moetier
