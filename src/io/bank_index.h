// The converted model's index (`moetier-index.json`, DESIGN.md "Bank format"): which data file
// holds each dense tensor and each MoE layer's expert bank, at which 4096-aligned offset, with
// its byte length and xxh64 checksum.
//
// A bank holds n_experts experts, expert after expert, each `expert_stride_bytes` apart (a
// multiple of 4096): gate [width, d_model], then up [width, d_model], then down [d_model,
// width], all of `dtype`, packed. So one expert is one byte range and one layer one region.
//
// dtypes are BF16, F16, F32, or GGUF's block-quantized Q8_0 / Q4_0 (`moetier convert --dtype`,
// `--dense-dtype`); every byte length is rows × DTypeRowBytes(dtype, row length), never
// elements × DTypeSize (0 for the quantized dtypes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace moetier {

inline constexpr const char* kBankIndexFileName = "moetier-index.json";
inline constexpr int kBankFormatVersion = 1;

struct BankIndexFile {
  std::string name;  // a plain file name in the model directory
  uint64_t bytes = 0;
};

struct BankIndexTensor {
  std::string name;  // the Hugging Face tensor name
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint32_t file = 0;
  uint64_t offset = 0;  // 4096-aligned
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct BankIndexBank {
  int64_t layer = 0;
  uint32_t file = 0;
  uint64_t offset = 0;  // 4096-aligned
  uint64_t bytes = 0;   // n_experts * expert_stride_bytes
  uint64_t xxh64 = 0;
  int64_t n_experts = 0;
  int64_t width = 0;    // expert_intermediate_size
  int64_t d_model = 0;  // hidden_size
  DType dtype = DType::kBF16;
  uint64_t expert_stride_bytes = 0;
};

struct BankIndex {
  std::string architecture;
  // What convert stored the experts as (every bank has this dtype) and, when it converted them,
  // the dense matrices (absent: kept as in the checkpoint; routers and 1-D tensors always are).
  // They let the loader accept weights that differ from config.json's torch_dtype on purpose.
  std::optional<DType> expert_dtype;
  std::optional<DType> dense_dtype;
  std::vector<BankIndexFile> files;
  std::vector<BankIndexTensor> tensors;
  std::vector<BankIndexBank> banks;  // ascending layer
};

// Parses and validates the index: version, known dtypes, sizes that agree with shapes, 4096
// alignment, ranges inside their files and not overlapping. `source` names the file in errors.
Expected<BankIndex> ParseBankIndex(const std::string& json_text, const std::string& source);
std::string SerializeBankIndex(const BankIndex& index);

// "0123456789abcdef"
std::string Hex64(uint64_t v);

}  // namespace moetier
