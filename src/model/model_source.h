// ModelSource: a model directory opened for loading, before any weight byte is read — its
// config, architecture, files (mapped, not read), and the size of each MoE layer's bank.
// Either a Hugging Face checkpoint or a converted model; the rest of loading does not care.
#pragma once

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "experts/expert_layout.h"
#include "experts/residency_plan.h"
#include "io/checkpoint.h"
#include "io/converted_model.h"
#include "model/arch/arch.h"
#include "model/config.h"

namespace moetier {

struct ModelSource {
  std::filesystem::path dir;
  ModelConfig config;
  const arch::ArchSpec* spec = nullptr;
  std::unique_ptr<Checkpoint> hf;             // set for a Hugging Face directory
  std::unique_ptr<ConvertedModel> converted;  // set for a converted directory
  ExpertLayout layout;                        // every bank's expert layout
  std::vector<LayerBank> banks;               // one per MoE layer, ascending

  const TensorStore& dense() const {
    return hf ? static_cast<const TensorStore&>(*hf) : static_cast<const TensorStore&>(*converted);
  }
  // Hands the dense store to the model (the source is spent afterwards).
  std::unique_ptr<TensorStore> TakeDense();
};

// The tensor names of every MoE layer's experts (the banks' contents; a tensor stacking a
// layer's experts once) and of its router.
std::set<std::string> ExpertTensorNames(const ModelSource& s);
std::set<std::string> RouterTensorNames(const ModelSource& s);

// Views of MoE layer `layer`'s experts in a Hugging Face checkpoint's maps (s.hf), after
// checking each tensor's presence, dtype and shape, and that all share s.layout's dtype: each
// expert's own tensors, or its rows of the layer's stacked tensors (ArchSpec::expert_tensor).
// Reads headers only. The loader copies banks from these; convert checks every layer first.
Expected<std::vector<ExpertWeights>> CheckpointExperts(const ModelSource& s, int64_t layer);

// Parses config.json, finds the architecture, opens the weight files and checks that a
// converted index agrees with config.json. Reads headers and the index only.
Expected<ModelSource> OpenModelSource(const std::filesystem::path& dir);
// As OpenModelSource, with `spec` in place of the registered architecture of the same name
// (config.json must name spec.hf_name): how a test opens a checkpoint whose tensors are laid
// out as no registered architecture's are (stacked experts). The source keeps `spec`'s address.
Expected<ModelSource> OpenModelSourceAs(const std::filesystem::path& dir,
                                        const arch::ArchSpec& spec);

}  // namespace moetier
