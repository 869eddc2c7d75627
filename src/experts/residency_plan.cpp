#include "experts/residency_plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <set>

namespace moetier {

namespace {

Status SpecError(const std::string& text, const std::string& why) {
  return Status::Error("--moe-cpu-layers '" + text + "': " + why +
                       " (use auto, 0, a count like 12, a fraction like 0.25, or ids like 0,5,7 "
                       "or 0-3,8)");
}

bool ParseInt(std::string_view s, int64_t& v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

std::string_view BackendName(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCpu:
      return "cpu";
    case Backend::kGpu:
      return "gpu";
    case Backend::kOffload:
      return "offload";
    case Backend::kHybrid:
      return "hybrid";
  }
  return "?";
}

Expected<Backend> ParseBackend(const std::string& text) {
  for (Backend b :
       {Backend::kAuto, Backend::kCpu, Backend::kGpu, Backend::kOffload, Backend::kHybrid})
    if (BackendName(b) == text) return b;
  return Status::Error("--moe-backend '" + text + "': expected auto, cpu, gpu, offload or hybrid");
}

Expected<CpuLayersSpec> ParseCpuLayersSpec(const std::string& raw) {
  CpuLayersSpec s;
  s.text = raw;
  std::string text;
  for (char c : raw)
    if (c != ' ') text.push_back(c);
  if (text.empty()) return SpecError(raw, "empty");
  if (text == "auto") return s;
  // Ids: a list (0,5,7), a range (0-3) or both; a single id needs a trailing comma (5,), since
  // a lone number is a count.
  if (text.find(',') != std::string::npos || text.find('-', 1) != std::string::npos) {
    s.kind = CpuLayersSpec::Kind::kIds;
    std::set<int64_t> ids;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t comma = text.find(',', pos);
      if (comma == std::string::npos) comma = text.size();
      const std::string item = text.substr(pos, comma - pos);
      pos = comma + 1;
      if (item.empty()) return SpecError(raw, "empty item");  // a trailing comma ends the loop
      const size_t dash = item.find('-', 1);
      int64_t a = 0, b = 0;
      if (dash != std::string::npos) {
        if (!ParseInt(std::string_view(item).substr(0, dash), a) ||
            !ParseInt(std::string_view(item).substr(dash + 1), b) || a < 0 || b < a)
          return SpecError(raw, "'" + item + "' is not a range of layer ids");
      } else {
        if (!ParseInt(item, a) || a < 0) return SpecError(raw, "'" + item + "' is not a layer id");
        b = a;
      }
      // No model has a million layers; the cap keeps "0-999999999" from filling memory.
      constexpr int64_t kMaxLayerId = 1 << 20;
      if (b > kMaxLayerId) return SpecError(raw, "'" + item + "' names layers no model has");
      for (int64_t i = a; i <= b; ++i) ids.insert(i);
    }
    if (ids.empty()) return SpecError(raw, "no layer ids");
    s.ids.assign(ids.begin(), ids.end());
    return s;
  }
  int64_t count = 0;
  if (ParseInt(text, count)) {
    if (count < 0) return SpecError(raw, "a count cannot be negative");
    s.kind = CpuLayersSpec::Kind::kCount;
    s.count = count;
    return s;
  }
  char* end = nullptr;
  const double f = std::strtod(text.c_str(), &end);
  if (end != text.c_str() && *end == '\0' && text.find('.') != std::string::npos) {
    if (!(f >= 0.0 && f <= 1.0)) return SpecError(raw, "a fraction must lie in [0, 1]");
    s.kind = CpuLayersSpec::Kind::kFraction;
    s.fraction = f;
    return s;
  }
  return SpecError(raw, "not understood");
}

uint64_t ResidencyPlan::BytesIn(Tier t) const {
  uint64_t n = 0;
  for (const auto& l : layers) {
    if (l.tier == t) n += l.bytes;
    if (l.has_cpu_copy() && l.cpu_copy_tier == t) n += l.cpu_copy_bytes;
  }
  return n;
}

uint64_t ResidencyPlan::CpuCopyBytes() const {
  uint64_t n = 0;
  for (const auto& l : layers) n += l.cpu_copy_bytes;
  return n;
}

bool PinsPacked(const PlanInputs& in, const LayerBank& b) {
  return in.pack_pinned && in.gpu_available && b.cpu_bytes != 0 && b.cpu_dtype == DType::kBF16C;
}

std::vector<size_t> LayerMoveOrder(const std::vector<LayerBank>& banks) {
  std::vector<size_t> order(banks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (banks[a].bytes != banks[b].bytes) return banks[a].bytes > banks[b].bytes;
    return banks[a].layer < banks[b].layer;
  });
  return order;
}

namespace {

uint64_t PinnedBytes(const PlanInputs& in, const LayerBank& b) {
  return PinsPacked(in, b) ? b.cpu_bytes : b.bytes;
}

size_t BankIndexOf(const std::vector<LayerBank>& banks, int64_t layer) {
  auto it = std::find_if(banks.begin(), banks.end(),
                         [&](const LayerBank& b) { return b.layer == layer; });
  return static_cast<size_t>(it - banks.begin());
}

Status CheckCpuLayersFit(const CpuLayersSpec& spec, const std::vector<LayerBank>& banks) {
  if (spec.kind == CpuLayersSpec::Kind::kCount && spec.count > static_cast<int64_t>(banks.size()))
    return Status::Error("--moe-cpu-layers " + std::to_string(spec.count) +
                         ": the model has only " + std::to_string(banks.size()) + " MoE layers");
  if (spec.kind != CpuLayersSpec::Kind::kIds) return OkStatus();
  for (int64_t id : spec.ids) {
    if (BankIndexOf(banks, id) < banks.size()) continue;
    std::string moe;
    for (const auto& b : banks) {
      if (!moe.empty()) moe.push_back(',');
      moe.append(std::to_string(b.layer));
    }
    return Status::Error("--moe-cpu-layers: layer " + std::to_string(id) +
                         " is not a MoE layer of this model (MoE layers: " + moe + ")");
  }
  return OkStatus();
}

}  // namespace

Expected<ResidencyPlan> PlanResidency(const PlanInputs& in) {
  ResidencyPlan plan;
  plan.budgets = in.budgets;
  plan.backend = in.backend;
  if (plan.backend == Backend::kAuto)
    plan.backend = in.gpu_available ? Backend::kHybrid : Backend::kCpu;
  if (plan.backend == Backend::kGpu && !in.gpu_available) {
    plan.warnings.push_back(
        "--moe-backend gpu: no usable CUDA device (or a build without CUDA, or --no-gpu); "
        "running on the CPU");
    plan.backend = Backend::kCpu;
  }

  const size_t n = in.banks.size();
  if (plan.backend == Backend::kGpu) {  // every bank in VRAM (a BF16C one expanded there)
    MT_RETURN_IF_ERROR(CheckCpuLayersFit(in.cpu_layers, in.banks));
    plan.layers.resize(n);
    for (size_t i = 0; i < n; ++i)
      plan.layers[i] =
          LayerResidency{in.banks[i].layer, Tier::kGpu, in.banks[i].bytes, in.banks[i].dtype};
    return plan;
  }
  std::vector<bool> on_cpu(n, plan.backend == Backend::kCpu);
  const std::vector<size_t> order = LayerMoveOrder(in.banks);

  // The spec must fit the model whatever the backend (with cpu it changes nothing, but a layer
  // id the model lacks is a mistake the user should hear about).
  MT_RETURN_IF_ERROR(CheckCpuLayersFit(in.cpu_layers, in.banks));
  if (plan.backend != Backend::kCpu) {
    const CpuLayersSpec& spec = in.cpu_layers;
    switch (spec.kind) {
      case CpuLayersSpec::Kind::kIds:
        for (int64_t id : spec.ids) on_cpu[BankIndexOf(in.banks, id)] = true;
        break;
      case CpuLayersSpec::Kind::kCount:
        for (int64_t i = 0; i < spec.count; ++i) on_cpu[order[static_cast<size_t>(i)]] = true;
        break;
      case CpuLayersSpec::Kind::kFraction: {
        const auto k = static_cast<size_t>(std::llround(spec.fraction * static_cast<double>(n)));
        for (size_t i = 0; i < k && i < n; ++i) on_cpu[order[i]] = true;
        break;
      }
      case CpuLayersSpec::Kind::kAuto:
        break;
    }
    // The pin budget is hard: with `auto` this is how the CPU layers are chosen; with an explicit
    // spec, layers beyond it also move to the CPU, with a warning.
    if (in.budgets.pin_bytes) {
      uint64_t pinned = 0;
      for (size_t i = 0; i < n; ++i)
        if (!on_cpu[i]) pinned += PinnedBytes(in, in.banks[i]);
      size_t moved = 0;
      uint64_t moved_bytes = 0;
      for (size_t i : order) {
        if (pinned <= *in.budgets.pin_bytes) break;
        if (on_cpu[i]) continue;
        on_cpu[i] = true;
        pinned -= PinnedBytes(in, in.banks[i]);
        moved_bytes += PinnedBytes(in, in.banks[i]);
        ++moved;
      }
      if (moved > 0 && spec.kind != CpuLayersSpec::Kind::kAuto)
        plan.warnings.push_back("--moe-cpu-layers " + spec.text + " leaves more to pin than the " +
                                FormatGb(*in.budgets.pin_bytes) + " pin budget; " +
                                std::to_string(moved) + " more layer(s) (" + FormatGb(moved_bytes) +
                                ") go to the CPU executor");
    }
  }

  plan.layers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const LayerBank& b = in.banks[i];
    plan.layers[i] = on_cpu[i] ? LayerResidency{b.layer, Tier::kLocked, b.CpuBytes(), b.CpuDType()}
                     : PinsPacked(in, b)
                         ? LayerResidency{b.layer, Tier::kPinned, b.cpu_bytes, b.cpu_dtype}
                         : LayerResidency{b.layer, Tier::kPinned, b.bytes, b.dtype};
  }

  if (in.budgets.lock_bytes) {
    uint64_t locked = plan.BytesIn(Tier::kLocked);
    size_t moved = 0;
    uint64_t moved_bytes = 0;
    for (size_t i : order) {
      if (locked <= *in.budgets.lock_bytes) break;
      if (plan.layers[i].tier != Tier::kLocked) continue;
      plan.layers[i].tier = Tier::kPageable;
      locked -= plan.layers[i].bytes;
      moved_bytes += plan.layers[i].bytes;
      ++moved;
    }
    if (moved > 0)
      plan.warnings.push_back(
          std::to_string(moved) + " layer(s) (" + FormatGb(moved_bytes) + ") exceed the " +
          FormatGb(*in.budgets.lock_bytes) + " lock budget (" + in.budgets.lock_source +
          ") and stay pageable: the OS may evict them, and every evicted page costs a disk read "
          "during decode; raise --lock-budget-gb or `ulimit -l`");
  }
  if (plan.backend == Backend::kHybrid) PlanCpuCopies(in, plan);
  return plan;
}

void PlanCpuCopies(const PlanInputs& in, ResidencyPlan& plan) {
  if (in.ram_for_banks == 0 || !in.gpu_available) return;
  uint64_t held = 0;
  for (const LayerResidency& l : plan.layers) held += l.bytes;
  uint64_t locked = plan.BytesIn(Tier::kLocked);
  int64_t left_out = 0;
  uint64_t left_out_bytes = 0;
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    LayerResidency& l = plan.layers[i];
    const LayerBank& b = in.banks[i];
    if (l.tier != Tier::kPinned || b.cpu_bytes == 0 || l.dtype == b.cpu_dtype) continue;
    const bool fits_lock = !in.budgets.lock_bytes || locked + b.cpu_bytes <= *in.budgets.lock_bytes;
    if (!fits_lock || held + b.cpu_bytes > in.ram_for_banks) {
      ++left_out;
      left_out_bytes += b.cpu_bytes;
      continue;
    }
    l.cpu_copy_bytes = b.cpu_bytes;
    l.cpu_copy_dtype = b.cpu_dtype;
    l.cpu_copy_tier = Tier::kLocked;
    locked += b.cpu_bytes;
    held += b.cpu_bytes;
  }
  if (left_out > 0)
    plan.warnings.push_back(
        "hybrid: " + std::to_string(left_out) + " pinned layer(s) keep no " +
        std::string(DTypeName(in.banks.front().cpu_dtype)) + " copy for the CPU executor (" +
        FormatGb(left_out_bytes) +
        " more than the lock budget or free RAM allow): the CPU's share of their experts reads "
        "the pinned bank, more bytes for the same values; raise --lock-budget-gb or free RAM");
}

}  // namespace moetier
