// The residency plan: per MoE layer, the tier its expert bank should settle to, chosen from the
// backend, the pin and lock budgets and --moe-cpu-layers before a weight byte is read. A layer on
// a CPU tier counts its packed bytes (LayerBank::cpu_bytes) against the lock budget. Pinned
// layers keep the stored format, unless PlanInputs::pack_pinned holds them as BF16C (which the
// GPU expands after the copy: fewer bytes pinned and across PCIe). With hybrid, a pinned layer
// held as stored whose experts the CPU holds packed may also keep a packed copy for the CPU
// executor's share of its steps (PlanCpuCopies).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "experts/budgets.h"
#include "experts/tier.h"

namespace moetier {

enum class Backend { kAuto, kCpu, kGpu, kOffload, kHybrid };
std::string_view BackendName(Backend b);
// Parses --moe-backend (auto|cpu|gpu|offload|hybrid).
Expected<Backend> ParseBackend(const std::string& text);

// --moe-cpu-layers: which MoE layers are `locked` and decode on the CPU executor.
struct CpuLayersSpec {
  enum class Kind { kAuto, kIds, kCount, kFraction };
  Kind kind = Kind::kAuto;
  std::vector<int64_t> ids;  // kIds
  int64_t count = 0;         // kCount (0: none)
  double fraction = 0.0;     // kFraction, in [0, 1]
  std::string text;          // as the user wrote it, for messages
};
// Forms: `auto`; `0` (none); a count `12`; a fraction `0.25`; layer ids `0,5,7` or ranges
// `0-3,8` (a single id needs a trailing comma: `5,`). Errors name --moe-cpu-layers.
Expected<CpuLayersSpec> ParseCpuLayersSpec(const std::string& text);

struct LayerBank {
  int64_t layer = 0;   // model layer index
  uint64_t bytes = 0;  // the bank's bytes as stored (what a pinned bank holds)
  DType dtype = DType::kBF16;
  // The bank held for the CPU executor, packed (experts/weight_packing.h); 0 bytes: as stored.
  uint64_t cpu_bytes = 0;
  DType cpu_dtype = DType::kBF16;

  uint64_t CpuBytes() const { return cpu_bytes != 0 ? cpu_bytes : bytes; }
  DType CpuDType() const { return cpu_bytes != 0 ? cpu_dtype : dtype; }
};

struct LayerResidency {
  int64_t layer = 0;
  Tier tier = Tier::kPageable;
  uint64_t bytes = 0;          // as held in that tier (packed on the CPU tiers)
  DType dtype = DType::kBF16;  // as held in that tier
  // A pinned layer's copy of its experts for the CPU executor (LayerBank::cpu_dtype): hybrid
  // steps' CPU share reads it instead of the pinned bank, fewer bytes for the same values.
  // 0 bytes: none. Planned locked; settled locked, or pageable where the lock failed.
  uint64_t cpu_copy_bytes = 0;
  DType cpu_copy_dtype = DType::kBF16;
  Tier cpu_copy_tier = Tier::kLocked;

  bool has_cpu_copy() const { return cpu_copy_bytes != 0; }
};

struct ResidencyPlan {
  Backend backend = Backend::kCpu;  // resolved (never kAuto)
  std::vector<LayerResidency> layers;
  Budgets budgets;
  std::vector<std::string> warnings;  // one line each, for stderr

  uint64_t BytesIn(Tier t) const;  // banks and CPU copies held in tier t
  uint64_t CpuCopyBytes() const;
};

struct PlanInputs {
  Backend backend = Backend::kAuto;
  bool gpu_available = false;
  std::vector<LayerBank> banks;  // the model's MoE layers, ascending
  Budgets budgets;
  CpuLayersSpec cpu_layers;
  // What the banks and CPU copies may take together (budgets.h RamForBanks); 0: unknown, and
  // no CPU copies are planned.
  uint64_t ram_for_banks = 0;
  // Pinned banks held as BF16C where the CPU holds them so (LayerBank::cpu_dtype), for a GPU
  // that expands them in VRAM (kernels/cuda/bf16c_expand.h); they then need no CPU copy.
  bool pack_pinned = false;
};

// Whether a pinned bank is held packed (PlanInputs::pack_pinned).
bool PinsPacked(const PlanInputs& in, const LayerBank& b);

// The order in which layers leave a tier when a budget is short (to the CPU when pinned bytes
// exceed the pin budget, and to pageable when locked bytes exceed the lock budget), and in which
// a count or fraction of --moe-cpu-layers picks them. The rule: larger banks first, since each
// move then frees the most budget and the fewest layers move; on equal sizes the lower layer id
// first, as llama.cpp's --n-cpu-moe does, so a user comparing the two sees the same split.
std::vector<size_t> LayerMoveOrder(const std::vector<LayerBank>& banks);

// Hybrid's CPU copies (LayerResidency::cpu_copy_bytes), added to a plan whose tiers are set,
// when a GPU is usable: one for every pinned layer held as stored whose experts the CPU holds
// packed (LayerBank::cpu_bytes), while the locked bytes with the copies stay within the lock budget
// and every bank with the copies within in.ram_for_banks. A copy is an optimisation: where they do
// not all fit, the plan warns and the layers without one have their CPU share read from the pinned
// bank.
void PlanCpuCopies(const PlanInputs& in, ResidencyPlan& plan);

Expected<ResidencyPlan> PlanResidency(const PlanInputs& in);

}  // namespace moetier
