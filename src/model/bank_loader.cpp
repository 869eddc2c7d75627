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
#include "model/weight_binder.h"

namespace moetier {

namespace {

// Copies layer `layer`'s experts out of a Hugging Face checkpoint's maps into `bank`, checking
// each tensor's presence, dtype and shape first.
Status FillFromCheckpoint(const ModelSource& s, int64_t layer, HostBank& bank, ThreadPool& pool) {
  const ExpertLayout& lay = s.layout;
  const int64_t E = s.config.n_experts;
  WeightBinder b(*s.hf, s.config);
  std::vector<ExpertWeights> src(static_cast<size_t>(E));
  for (int64_t e = 0; e < E && b.status().ok(); ++e) {
    auto& w = src[static_cast<size_t>(e)];
    w.gate = b.Matrix(s.spec->expert_tensor_name(layer, e, ExpertMatrix::kGate),
                      {lay.width, lay.d_model});
    w.up =
        b.Matrix(s.spec->expert_tensor_name(layer, e, ExpertMatrix::kUp), {lay.width, lay.d_model});
    w.down = b.Matrix(s.spec->expert_tensor_name(layer, e, ExpertMatrix::kDown),
                      {lay.d_model, lay.width});
    for (const TensorView* v : {&w.gate, &w.up, &w.down})
      if (b.status().ok() && v->dtype != lay.dtype)
        return Status::Error(s.hf->description() + ": layer " + std::to_string(layer) + " expert " +
                             std::to_string(e) + " is " + std::string(DTypeName(v->dtype)) +
                             " but the other experts are " + std::string(DTypeName(lay.dtype)));
  }
  MT_RETURN_IF_ERROR(b.status());
  pool.ParallelFor(static_cast<size_t>(E), [&](size_t begin, size_t end, int) {
    for (size_t e = begin; e < end; ++e) {
      uint8_t* dst = bank.data() + e * lay.stride_bytes();
      std::memcpy(dst + lay.gate_offset(), src[e].gate.data, lay.gate_up_bytes());
      std::memcpy(dst + lay.up_offset(), src[e].up.data, lay.gate_up_bytes());
      std::memcpy(dst + lay.down_offset(), src[e].down.data, lay.down_bytes());
    }
  });
  return OkStatus();
}

// Runs checksum + settle for banks handed to it, one at a time, on its own thread.
class Settler {
 public:
  Settler(const ModelSource& s, const ResidencyPlan& plan, const BankLoadOptions& opts,
          std::vector<HostBank>& banks, std::vector<LayerResidency>& settled)
      : s_(s),
        plan_(plan),
        opts_(opts),
        banks_(banks),
        settled_(settled),
        inject_(FailureInjectionFromEnv()),
        thread_([this] { Run(); }) {}
  ~Settler() { Finish(); }

  void Submit(size_t i) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(i);
    }
    cv_.notify_one();
  }
  // Waits for every submitted bank; returns the first checksum failure.
  Status Finish() {
    {
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  std::vector<std::string> warnings;

 private:
  void Run() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        i = queue_.front();
        queue_.pop_front();
      }
      Settle(i);
    }
  }
  void Settle(size_t i) {
    HostBank& bank = banks_[i];
    const int64_t layer = plan_.layers[i].layer;
    if (s_.converted && opts_.verify && status_.ok()) {
      const BankIndexBank& b = s_.converted->index().banks[i];
      const uint64_t got = Checksum64(bank.data(), bank.size());
      if (got != b.xxh64)
        status_ = Status::Error(s_.converted->FilePath(b.file).string() +
                                ": checksum mismatch in the expert bank of layer " +
                                std::to_string(layer) + " (xxh64 " + Hex64(got) + ", index says " +
                                Hex64(b.xxh64) + "); the file is corrupt: re-run moetier convert");
    }
    const SettleResult r =
        SettleBank(bank, layer, plan_.layers[i].tier, opts_.gpu_available, inject_);
    settled_[i] = {layer, r.tier, bank.size()};
    if (!r.warning.empty()) warnings.push_back(r.warning);
  }

  const ModelSource& s_;
  const ResidencyPlan& plan_;
  const BankLoadOptions& opts_;
  std::vector<HostBank>& banks_;
  std::vector<LayerResidency>& settled_;
  FailureInjection inject_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  bool done_ = false;
  Status status_;
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace

Expected<LoadedBanks> LoadBanks(const ModelSource& s, const ResidencyPlan& plan,
                                const BankLoadOptions& opts, ThreadPool& io_pool) {
  const size_t n = s.banks.size();
  LoadedBanks out;
  out.settled.resize(n);
  std::vector<HostBank> banks(n);
  uint64_t total = 0, done = 0;
  for (const auto& b : s.banks) total += b.bytes;
  Progress progress("loading experts", total);
  ReadMode mode = ReadMode::kDirect;
  {
    Settler settler(s, plan, opts, banks, out.settled);
    for (size_t i = 0; i < n; ++i) {
      MT_ASSIGN_OR_RETURN(banks[i], HostBank::Allocate(s.banks[i].bytes));
      const auto t_read = std::chrono::steady_clock::now();
      if (s.converted) {
        ReadMode m;
        MT_RETURN_IF_ERROR(
            s.converted->ReadBank(s.converted->index().banks[i], banks[i].data(), io_pool, &m));
        if (m == ReadMode::kBuffered) mode = m;
      } else {
        MT_RETURN_IF_ERROR(FillFromCheckpoint(s, s.banks[i].layer, banks[i], io_pool));
      }
      LogDebug(
          "bank " + std::to_string(i) + " read in " +
          std::to_string(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_read).count()) +
          " s");
      settler.Submit(i);
      done += s.banks[i].bytes;
      progress.Update(done, "layer " + std::to_string(s.banks[i].layer));
    }
    MT_RETURN_IF_ERROR(settler.Finish());
    out.warnings = std::move(settler.warnings);
  }
  progress.Finish();
  out.read_mode = !s.converted ? "mmap" : mode == ReadMode::kDirect ? "o_direct" : "buffered";
  std::vector<int64_t> layers;
  for (const auto& b : s.banks) layers.push_back(b.layer);
  out.experts = std::make_unique<BankedExperts>(s.config.n_layers, std::move(layers),
                                                std::move(banks), s.layout, s.config.n_experts);
  return out;
}

}  // namespace moetier
