// The architectures moetier knows, by the class name in config.json's `architectures`.
// Each lives in one file of this folder: its config defaults, its tensor names and its forward.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/causal_lm.h"

namespace moetier::arch {

struct ArchSpec {
  std::string_view hf_name;  // e.g. "Qwen3MoeForCausalLM"
  ConfigDefaults (*defaults)();
  // Binds and validates the weights; the model keeps `checkpoint` (its memory maps) alive.
  Expected<std::unique_ptr<CausalLM>> (*create)(ModelConfig config, Checkpoint checkpoint,
                                                int n_threads);
};

const ArchSpec& Qwen3MoeSpec();
const ArchSpec& MixtralSpec();

// The spec for `hf_name`, or nullptr.
const ArchSpec* FindArch(std::string_view hf_name);
// "Qwen3MoeForCausalLM, MixtralForCausalLM"
std::string SupportedArchNames();

}  // namespace moetier::arch
