#include "model/bank_packing.h"

#include <atomic>
#include <mutex>
#include <string>

#include "kernels/cpu/bf16c.h"

namespace moetier {

Status PackExpertBank(const std::vector<ExpertWeights>& src, const ExpertLayout& to, uint8_t* dst,
                      int64_t layer, ThreadPool& pool) {
  if (to.dtype != DType::kBF16C)
    return Status::Error("PackExpertBank: no packer for " + std::string(DTypeName(to.dtype)));
  for (const ExpertWeights& w : src)
    for (const TensorView* v : {&w.gate, &w.up, &w.down})
      if (v->dtype != DType::kBF16)
        return Status::Error("PackExpertBank: layer " + std::to_string(layer) +
                             " experts are not bf16");
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string first_error;
  int64_t first_expert = -1;
  // One task per expert: 3 matrices of ~1.5 M weights each, many more tasks than threads.
  pool.ParallelTasks(src.size(), [&](size_t e, int) {
    if (failed.load(std::memory_order_relaxed)) return;
    uint8_t* expert = dst + e * to.stride_bytes();
    const struct {
      const char* name;
      const TensorView& from;
      uint8_t* to;
    } mats[] = {{"gate", src[e].gate, expert + to.gate_offset()},
                {"up", src[e].up, expert + to.up_offset()},
                {"down", src[e].down, expert + to.down_offset()}};
    for (const auto& m : mats) {
      const int64_t bad = kernels::PackRowsBf16c(static_cast<const uint16_t*>(m.from.data),
                                                 m.from.shape[0], m.from.shape[1], m.to);
      if (bad < 0) continue;
      failed.store(true, std::memory_order_relaxed);
      std::lock_guard<std::mutex> l(mu);
      if (first_expert < 0 || static_cast<int64_t>(e) < first_expert) {
        first_expert = static_cast<int64_t>(e);
        first_error = "layer " + std::to_string(layer) + " expert " + std::to_string(e) + " " +
                      m.name + " row " + std::to_string(bad) + " has more than " +
                      std::to_string(kernels::kBf16cMaxExceptions) +
                      " weights outside its 16 most common high bytes, so it does not pack "
                      "as bf16c";
      }
      return;
    }
  });
  if (failed.load()) return Status::Error(first_error);
  return OkStatus();
}

}  // namespace moetier
