// The architectures moetier knows, by the class name in config.json's `architectures`.
// Each lives in one file of this folder: its config quirks, its tensor names and its forward
// (docs/architecture.md, "Adding an architecture").
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "io/tensor_store.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/weight_binder.h"
#include "ops/expert_source.h"

namespace moetier {
struct DecoderWeights;  // model/decoder_lm.h
}  // namespace moetier

namespace moetier::arch {

struct ArchSpec {
  std::string_view hf_name;  // e.g. "Qwen3MoeForCausalLM"
  // Reads the architecture's own config.json keys, after the shared ones (ParseModelConfig):
  // the expert count and width, which layers are MoE, the routing and attention switches and
  // the defaults that differ from ModelConfig's.
  ArchConfigParser parse_config;
  // Where routed expert `expert`'s matrix `which` of MoE layer `layer` is in a Hugging Face
  // checkpoint: its own tensor, e.g. "model.layers.3.mlp.experts.5.gate_proj.weight", or the
  // expert's slice of a tensor stacking the layer's experts. Banks are built from these.
  ExpertTensorBinding (*expert_tensor)(int64_t layer, int64_t expert, ExpertMatrix which);
  // The Hugging Face name of a MoE layer's router matrix [n_experts, d_model], e.g.
  // "model.layers.3.mlp.gate.weight". convert keeps routers in their source dtype.
  std::string (*router_tensor_name)(int64_t layer);
  // The token-embedding table's name, e.g. "model.embed_tokens.weight" (the lm_head too when
  // config.json ties them).
  std::string_view embedding_tensor_name;
  // The dense weights the config implies (every tensor but the routed experts), each checked
  // by `binder` for presence, dtype and shape; the first failure is in binder.status() and the
  // names read in binder.requested(). The one list of them: create binds through it, and
  // convert calls it to refuse, before writing, what loading would refuse.
  DecoderWeights (*bind_dense)(const ModelConfig& config, WeightBinder& binder);
  // Binds and validates the dense weights of `dense` (bind_dense) and takes the routed experts
  // from `experts`; the model keeps both alive.
  Expected<std::unique_ptr<CausalLM>> (*create)(ModelConfig config,
                                                std::unique_ptr<TensorStore> dense,
                                                std::unique_ptr<ExpertSource> experts,
                                                const ComputeOptions& compute);

  // The name of the tensor holding that matrix (for a stacked layout, the stacked tensor).
  std::string expert_tensor_name(int64_t layer, int64_t expert, ExpertMatrix which) const {
    return expert_tensor(layer, expert, which).name;
  }
};

const ArchSpec& Qwen3MoeSpec();
const ArchSpec& MixtralSpec();

// The spec for `hf_name`, or nullptr.
const ArchSpec* FindArch(std::string_view hf_name);
// "Qwen3MoeForCausalLM, MixtralForCausalLM"
std::string SupportedArchNames();

}  // namespace moetier::arch
