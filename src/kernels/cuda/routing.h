// A step's routing for one MoE layer, in device memory: experts/routing.h's Routing, plus each
// token's assignments in ascending expert order (for the routed sum). Filled on the device by
// LaunchGroupByExpert (router.h), so no count or id has to reach the host before the experts
// run; kernels that depend on the number of active experts are launched for the most there can
// be (min(n_experts, n_tokens * top_k)) and let the blocks past *n_active return at once.
//
// Every array is the caller's, sized for the largest step: n_experts + 1 for begin, n_experts
// for experts, max_tokens * top_k for the others.
#pragma once

#include <cstdint>

namespace moetier::cuda {

struct DeviceRouting {
  int64_t n_tokens = 0;
  int64_t top_k = 0;
  int64_t n_experts = 0;        // of the layer (not the active ones)
  int32_t* n_active = nullptr;  // [1] experts chosen by any token
  int32_t* experts = nullptr;   // [n_experts] the chosen experts, ascending (first *n_active)
  int32_t* begin =
      nullptr;  // [n_experts + 1] active expert a's assignments: [begin[a], begin[a+1])
  int32_t* token_of = nullptr;   // [n_tokens * top_k] each assignment's token, expert-major,
                                 // tokens ascending within an expert
  float* weight_of = nullptr;    // [n_tokens * top_k] each assignment's routing weight
  int32_t* assign_of = nullptr;  // [n_tokens, top_k] token t's assignments, experts ascending

  int64_t n_assignments() const { return n_tokens * top_k; }
  // The most experts a step can activate: grid size for per-expert kernels.
  int64_t max_active() const { return n_experts < n_assignments() ? n_experts : n_assignments(); }
};

}  // namespace moetier::cuda
