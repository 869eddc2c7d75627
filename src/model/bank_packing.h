// Packs one MoE layer's bf16 experts into a packed CPU format (BF16C) while a model loads: the
// loader's half of experts/weight_packing.h. Lossless; a row that does not pack (more
// exceptions than BF16C's header holds) makes the whole layer stay as stored.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "experts/expert_layout.h"
#include "ops/expert_source.h"

namespace moetier {

// Writes expert e of `src` (bf16 views, [width, d_model] gate/up and [d_model, width] down)
// into the bank at `dst` in layout `to` (to.dtype == kBF16C; dst holds to.bank_bytes(E) bytes,
// padding already zero). Experts are spread over `pool`. On a row that cannot be packed the
// Status names `layer`, the expert, the matrix and the row; dst is then unspecified.
Status PackExpertBank(const std::vector<ExpertWeights>& src, const ExpertLayout& to, uint8_t* dst,
                      int64_t layer, ThreadPool& pool);

}  // namespace moetier
