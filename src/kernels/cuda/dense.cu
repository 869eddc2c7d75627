// Dense matrix products on the GPU (dense.h).
//
// Decode (n_tokens <= kMaxDecodeTokens): our own kernels, one warp per weight row (float formats
// with several tokens: up to kMultiRows rows, see LaunchFloatDecode). The warp streams its row once
// per sweep of up to kTok tokens (the tokens of one sweep share every weight load; later sweeps
// find the row in L1/L2) and sums in fp32, then reduces across lanes.
//   - f32/f16/bf16: 16-byte loads of the row (8 weights a lane a step, kFloatUnroll steps in
//     flight), the activations read as float4 from L1/L2. Rows whose bytes are not 16-byte
//     aligned take a per-element path (correct, slower; no real model has them).
//   - Q8_0/Q4_0: the activations are first quantized to int8 per 32-block exactly as the CPU's
//     kernels do (kernels/cpu/matmul_scalar.cpp); the warp copies 64 blocks of its row at a time
//     into shared memory with the widest loads the row's alignment allows (blocks are only 2-byte
//     aligned; Q4_0 warps of several rows, two rows at once), then each lane takes whole
//     blocks: integer dots with __dp4a, and (float)dot * d_w * dx summed in fp32. x is quantized
//     once into scratch, or handed over quantized by the norm that wrote it (QuantizedActs),
//     and up to four matrices of that x (q, k, v) are one launch. With the fused launches
//     (FusedLaunches, off by default) up to kMaxFusedTokens tokens, each block of one resident
//     wave quantizes x into its shared memory instead.
// At one token the float kernels are a pure weight stream (every byte read once with coalesced
// 16-byte loads): 4.28 TB/s on a bf16 lm_head on the H200 (a plain read of its bytes: 4.35), and
// launch- and tail-bound on matrices of ~16 MB. The quantized kernels spend more
// instructions a byte (staging, unpacking) and reach about half of that. fp32 FMAs and the
// activation loads bound the float formats from ~4 tokens, dp4a the quantized ones from ~8.
//
// Prefill (more tokens): cuBLAS GEMMs on tensor cores with fp32 output: bf16 copies of x for
// bf16 weights, f16 copies for f16 weights, TF32 for f32 weights; Q8_0/Q4_0 weights are
// dequantized to bf16 kDequantChunkBytes at a time. Activations (and quantized weights) lose
// bits to bf16/f16/tf32: about 1e-2 of a row's magnitude, the tolerance the tests state.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/dtype.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense.h"
#include "kernels/cuda/dense_decode.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {
namespace {

// Scratch for the dequantized (bf16) weight rows of one GEMM: big enough that each GEMM keeps
// the tensor cores busy, small next to the VRAM the weights themselves take.
constexpr int64_t kDequantChunkBytes = 64ll << 20;
// cuBLAS workspace: what NVIDIA recommends for Hopper.
constexpr size_t kCublasWorkspaceBytes = 32u << 20;
constexpr int kElementThreads = 256;
constexpr int64_t kMaxElementBlocks = 8192;  // grid-stride conversion kernels

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

using namespace dense_decode;  // NOLINT: the decode kernels, dense_decode.cuh

// ---- prefill helpers -----------------------------------------------------------------------

int ElementGrid(int64_t n) {
  const int64_t blocks = CeilDiv(n, kElementThreads);
  return static_cast<int>(blocks < kMaxElementBlocks ? blocks : kMaxElementBlocks);
}

// out[i] = bf16 (or f16) of x[i], round to nearest even.
template <bool kF16>
__global__ void ToHalfKernel(const float* x, int64_t n, uint16_t* out) {
  PdlWait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = kF16 ? FloatToF16Bits(x[i]) : FloatToBf16Bits(x[i]);
}

// Rows [0, n_rows) of a Q8_0/Q4_0 matrix (starting at `w`) to bf16 [n_rows, cols].
template <DType kD>
__global__ void DequantToBf16Kernel(const uint8_t* w, int64_t n_rows, int64_t cols, uint16_t* out) {
  PdlWait();
  constexpr int kBB = kQBlockBytes<kD>;
  const int64_t n = n_rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t blk_index = i / 32;  // rows are whole blocks: blocks are consecutive
    const int j = static_cast<int>(i % 32);
    const uint8_t* blk = w + blk_index * kBB;
    int code;
    if constexpr (kD == DType::kQ8_0) {
      code = static_cast<int8_t>(blk[2 + j]);
    } else {
      const uint8_t byte = blk[2 + (j & 15)];
      code = (j < 16 ? (byte & 15) : (byte >> 4)) - 8;
    }
    out[i] = FloatToBf16Bits(F16BitsToFloat(LoadU16(blk)) * static_cast<float>(code));
  }
}

// ---- launch --------------------------------------------------------------------------------

// Rows a warp of the vectorized float kernel takes: one for one token (a pure stream, the most
// warps); for more tokens up to kMultiRows (each activation load then feeds that many rows),
// as long as the grid keeps kMinDecodeBlocks blocks (about one per SM of a 132-SM H200).
constexpr int kMultiRows = 4;
constexpr int64_t kMinDecodeBlocks = 128;

// The most bytes of weights a float decode launch asks L2 to prefetch (PrefetchWeights): about
// half the H200's L2. Past it (lm_head: 622 MB in bf16) the prefetched lines are evicted before
// their warps read them, and the hints cost instructions: bf16 lm_head alone 166 us with them,
// 145 without; one bf16 sequence's decode 2-3 % faster without them in two same-call rounds.
constexpr int64_t kMaxPrefetchBytes = 32ll << 20;

template <DType kD, int kTok, int kRows>
void LaunchFloatRows(const MatrixList& list, int64_t cols, const float* x, int64_t n_tokens,
                     cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(CeilDiv(ListedRows(list, kRows), kDecodeWarps * kRows));
  const bool prefetch =
      PrefetchWeights() && ListedRows(list, 1) * cols * kElemBytes<kD> <= kMaxPrefetchBytes;
  Launch(FloatDecodeKernel<kD, kTok, kRows>, blocks, kDecodeThreads, 0, stream, list, cols, x,
         n_tokens, prefetch);
}

// Whether the vectorized float kernel can read w and x.
bool FloatVectorizable(const DeviceMatrix& w, const float* x) {
  return w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// The listed matrices' products (each FloatVectorizable) in one launch.
template <DType kD, int kTok>
void LaunchFloatList(const MatrixList& list, int64_t cols, const float* x, int64_t n_tokens,
                     cudaStream_t stream) {
  const int64_t rows = ListedRows(list, 1);
  if constexpr (kTok == 1) {
    LaunchFloatRows<kD, 1, 1>(list, cols, x, n_tokens, stream);
  } else if (CeilDiv(rows, kDecodeWarps * kMultiRows) >= kMinDecodeBlocks) {
    LaunchFloatRows<kD, kTok, kMultiRows>(list, cols, x, n_tokens, stream);
  } else if (CeilDiv(rows, kDecodeWarps * 2) >= kMinDecodeBlocks) {
    LaunchFloatRows<kD, kTok, 2>(list, cols, x, n_tokens, stream);
  } else {
    LaunchFloatRows<kD, kTok, 1>(list, cols, x, n_tokens, stream);
  }
}

template <DType kD, int kTok>
void LaunchFloatDecode(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
                       cudaStream_t stream) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  if (!FloatVectorizable(w, x)) {
    const auto blocks = static_cast<unsigned>(CeilDiv(w.rows, kDecodeWarps));
    Launch(FloatScalarKernel<kD, kTok>, blocks, kDecodeThreads, 0, stream, data, w.rows, w.cols, x,
           n_tokens, y);
    return;
  }
  MatrixList one;
  one.w[0] = data;
  one.y[0] = y;
  one.rows[0] = w.rows;
  one.n = 1;
  LaunchFloatList<kD, kTok>(one, w.cols, x, n_tokens, stream);
}

// Rows a warp of the quantized decode kernel takes: one, unless the matrix is long enough to
// keep kQuantRowsBlocks blocks busy with more (lm_head: 8), each warp's rows prefetched at once.
constexpr int64_t kQuantRowsBlocks = 528;  // 4 blocks of 8 warps an SM of a 132-SM H200
constexpr int64_t kMaxQuantRowsPerWarp = 8;

int QuantRowsPerWarp(int64_t rows) {
  if (!PrefetchWeights()) return 1;
  return static_cast<int>(
      std::clamp<int64_t>(rows / (kQuantRowsBlocks * kDecodeWarps), 1, kMaxQuantRowsPerWarp));
}

// The listed matrices' products with x quantized (xq, dx) in one launch.
template <DType kD, int kTok>
void LaunchQuantList(const MatrixList& list, int64_t cols, const int8_t* xq, const float* dx,
                     int64_t n_tokens, cudaStream_t stream) {
  const int per_warp = QuantRowsPerWarp(ListedRows(list, 1));
  const auto blocks =
      static_cast<unsigned>(CeilDiv(ListedRows(list, per_warp), kDecodeWarps * per_warp));
  // Q4_0 warps of several rows stage two at a time (QuantDecodeKernel; the q4_0 lm_head on the
  // H200, decoding: 71.4 us a token against 80 one at a time). Q8_0 rows are twice the bytes:
  // two staged take ~240 registers, one block an SM.
  auto* kernel = QuantDecodeKernel<kD, kTok, 1>;
  if constexpr (kD == DType::kQ4_0) {
    if (per_warp > 1) kernel = QuantDecodeKernel<kD, kTok, 2>;
  }
  Launch(kernel, blocks, kDecodeThreads, 0, stream, list, cols / 32, xq, dx, n_tokens, per_warp,
         PrefetchWeights());
}

// Tokens a sweep of the rows takes: the smallest of 1, 2, 4, 8 that holds n_tokens, else 8
// (several sweeps).
template <template <DType, int> class Launch, DType kD, typename... Args>
void ByTokens(int64_t n_tokens, Args&&... args) {
  if (n_tokens == 1) return Launch<kD, 1>::Run(std::forward<Args>(args)...);
  if (n_tokens == 2) return Launch<kD, 2>::Run(std::forward<Args>(args)...);
  if (n_tokens <= 4) return Launch<kD, 4>::Run(std::forward<Args>(args)...);
  return Launch<kD, 8>::Run(std::forward<Args>(args)...);
}

template <DType kD, int kTok>
struct FloatDecode {
  static void Run(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
                  cudaStream_t stream) {
    LaunchFloatDecode<kD, kTok>(w, x, n_tokens, y, stream);
  }
};
template <DType kD, int kTok>
struct FloatListDecode {
  static void Run(const MatrixList& list, int64_t cols, const float* x, int64_t n_tokens,
                  cudaStream_t stream) {
    LaunchFloatList<kD, kTok>(list, cols, x, n_tokens, stream);
  }
};
template <DType kD, int kTok>
struct QuantListDecode {
  static void Run(const MatrixList& list, int64_t cols, const int8_t* xq, const float* dx,
                  int64_t n_tokens, cudaStream_t stream) {
    LaunchQuantList<kD, kTok>(list, cols, xq, dx, n_tokens, stream);
  }
};

// Most tokens, and most shared memory (the default limit, no opt-in), of the fused kernel.
constexpr int64_t kMaxFusedTokens = 8;
constexpr size_t kMaxFusedSmemBytes = 48u << 10;

// The fused kernel's blocks: one resident wave (as many as the SMs hold at this shared memory),
// or fewer where the rows need fewer.
template <DType kD, int kTok>
unsigned FusedGrid(int64_t total_rows, size_t smem, int sm_count) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, FusedQuantDecodeKernel<kD, kTok>,
                                                    kDecodeThreads, smem) != cudaSuccess ||
      per_sm < 1)
    per_sm = 1;
  const int64_t wave = static_cast<int64_t>(per_sm) * sm_count;
  const int64_t needed = CeilDiv(total_rows, kDecodeWarps);
  return static_cast<unsigned>(needed < wave ? needed : wave);
}

template <DType kD, int kTok>
struct FusedQuantDecode {
  static void Run(const MatrixList& p, int64_t cols, const float* x, int64_t nt, int sm_count,
                  cudaStream_t stream) {
    const int64_t total = ListedRows(p, 1);
    const size_t smem = FusedSmemBytes<kD>(nt, cols);
    Launch(FusedQuantDecodeKernel<kD, kTok>, FusedGrid<kD, kTok>(total, smem, sm_count),
           kDecodeThreads, smem, stream, p, cols / 32, x, static_cast<int>(nt));
  }
};

// Whether FusedQuantDecodeKernel takes nt tokens of `cols` columns of a quantized dtype.
bool FusedFits(DType dtype, int64_t nt, int64_t cols) {
  if (nt > kMaxFusedTokens || !FusedLaunches()) return false;
  const size_t smem = dtype == DType::kQ8_0 ? FusedSmemBytes<DType::kQ8_0>(nt, cols)
                                            : FusedSmemBytes<DType::kQ4_0>(nt, cols);
  return smem <= kMaxFusedSmemBytes;
}

// One cudaMalloc for State (empty when bytes == 0); *p stays null on failure.
Status AllocateDevice(size_t bytes, const std::string& what, void** p) {
  *p = nullptr;
  if (bytes == 0) return OkStatus();
  const cudaError_t err = cudaMalloc(p, bytes);
  if (err == cudaSuccess) return OkStatus();
  *p = nullptr;
  (void)cudaGetLastError();  // clear the error so that later calls are not blamed
  return CudaStatus(err, "allocating " + std::to_string(bytes) + " bytes of VRAM for " + what);
}

}  // namespace

// Owns its device allocations (freed with it); never moved (DenseMatMul holds it by pointer).
struct DenseMatMul::State {
  int64_t max_tokens = 0;
  int64_t max_cols = 0;
  int64_t max_rows = 0;
  int8_t* xq = nullptr;     // [min(max_tokens, kMaxDecodeTokens), max_cols] quantized x
  float* dx = nullptr;      // [min(max_tokens, kMaxDecodeTokens), max_cols / 32] its scales
  uint16_t* xh = nullptr;   // [max_tokens, max_cols] bf16/f16 x for cuBLAS (prefill only)
  uint16_t* wdq = nullptr;  // [wdq_elems] dequantized weight rows (prefill only)
  int64_t wdq_elems = 0;
  void* workspace = nullptr;            // kCublasWorkspaceBytes for cuBLAS (prefill only)
  const CublasLibrary* blas = nullptr;  // prefill only: loaded with its handle
  cublasHandle_t cublas = nullptr;
  int sm_count = 1;  // the device's, for the fused kernel's grid

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (cublas != nullptr) blas->destroy(cublas);
    for (void* p : {static_cast<void*>(xq), static_cast<void*>(dx), static_cast<void*>(xh),
                    static_cast<void*>(wdq), workspace})
      if (p != nullptr) cudaFree(p);
  }

  Status Allocate();
  void Decode(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
              cudaStream_t stream);
  // Quantized weights' decode: x's nt <= kMaxDecodeTokens rows of `cols` into xq/dx (returned),
  // then the products (at most kMaxListed, of one dtype and width) with them in one launch.
  QuantizedActs QuantizeX(const float* x, int64_t nt, int64_t cols, cudaStream_t stream);
  void QuantizedList(std::span<const Product> products, int64_t nt, const QuantizedActs& x8,
                     cudaStream_t stream);
  // Both in one launch, for the products of one x (FusedFits, at most kMaxListed).
  void FusedProduct(std::span<const Product> products, const float* x, int64_t nt,
                    cudaStream_t stream);
  // Float formats' decode: the products of one x (at most kMaxListed, FloatVectorizable) in one
  // launch.
  void FloatListProduct(std::span<const Product> products, const float* x, int64_t n_tokens,
                        cudaStream_t stream);
  void Prefill(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
               cudaStream_t stream);
  void Gemm(cudaDataType type, const void* w, int64_t n_rows, int64_t cols, const void* x,
            int64_t n_tokens, float* y, int64_t ldy, cublasComputeType_t compute);
};

Status DenseMatMul::State::Allocate() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sm_count < 1) {
    (void)cudaGetLastError();
    sm_count = 1;
  }
  const int64_t decode_tokens = max_tokens < kMaxDecodeTokens ? max_tokens : kMaxDecodeTokens;
  const auto n_decode = static_cast<size_t>(decode_tokens * max_cols);
  MT_RETURN_IF_ERROR(
      AllocateDevice(n_decode, "quantized activations", reinterpret_cast<void**>(&xq)));
  MT_RETURN_IF_ERROR(AllocateDevice((n_decode / 32 + 1) * sizeof(float),
                                    "quantized activation scales", reinterpret_cast<void**>(&dx)));
  if (max_tokens <= kMaxDecodeTokens) return OkStatus();
  MT_RETURN_IF_ERROR(AllocateDevice(static_cast<size_t>(max_tokens * max_cols) * 2,
                                    "bf16 activations", reinterpret_cast<void**>(&xh)));
  const int64_t all_rows = max_rows * max_cols * 2;
  const int64_t chunk = all_rows < kDequantChunkBytes ? all_rows : kDequantChunkBytes;
  const int64_t one_row = max_cols * 2;  // at least one row, however long
  wdq_elems = (chunk > one_row ? chunk : one_row) / 2;
  MT_RETURN_IF_ERROR(AllocateDevice(static_cast<size_t>(wdq_elems) * 2, "dequantized weight rows",
                                    reinterpret_cast<void**>(&wdq)));
  MT_RETURN_IF_ERROR(AllocateDevice(kCublasWorkspaceBytes, "the cuBLAS workspace", &workspace));
  MT_ASSIGN_OR_RETURN(blas, LoadCublas());
  if (blas->create(&cublas) != CUBLAS_STATUS_SUCCESS) {
    cublas = nullptr;
    return Status::Error("creating the cuBLAS handle for prefill matrix products failed");
  }
  return OkStatus();
}

Expected<DenseMatMul> DenseMatMul::Create(int64_t max_tokens, int64_t max_cols, int64_t max_rows) {
  DenseMatMul m;
  m.s_->max_tokens = max_tokens;
  m.s_->max_cols = max_cols;
  m.s_->max_rows = max_rows;
  MT_RETURN_IF_ERROR(m.s_->Allocate());
  return Expected<DenseMatMul>(std::move(m));
}

DenseMatMul::DenseMatMul() : s_(std::make_unique<State>()) {}
DenseMatMul::~DenseMatMul() = default;
DenseMatMul::DenseMatMul(DenseMatMul&&) noexcept = default;
DenseMatMul& DenseMatMul::operator=(DenseMatMul&&) noexcept = default;

void DenseMatMul::Run(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
                      cudaStream_t stream, const QuantizedActs* x8) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  if (x8 != nullptr && IsBlockQuantized(w.dtype) && n_tokens <= kMaxDecodeTokens) {
    const Product one{&w, y};
    return s_->QuantizedList(std::span(&one, 1), n_tokens, *x8, stream);
  }
  if (n_tokens <= kMaxDecodeTokens || s_->cublas == nullptr) {
    s_->Decode(w, x, n_tokens, y, stream);
  } else {
    s_->Prefill(w, x, n_tokens, y, stream);
  }
}

namespace {

// products (at most kMaxListed) as one list.
MatrixList ListOf(std::span<const DenseMatMul::Product> products) {
  MatrixList list;
  for (const DenseMatMul::Product& p : products) {
    list.w[list.n] = static_cast<const uint8_t*>(p.w->data);
    list.y[list.n] = p.y;
    list.rows[list.n] = p.w->rows;
    ++list.n;
  }
  return list;
}

}  // namespace

void DenseMatMul::State::Decode(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
                                cudaStream_t stream) {
  switch (w.dtype) {
    case DType::kF32:
      return ByTokens<FloatDecode, DType::kF32>(n_tokens, w, x, n_tokens, y, stream);
    case DType::kF16:
      return ByTokens<FloatDecode, DType::kF16>(n_tokens, w, x, n_tokens, y, stream);
    case DType::kBF16:
      return ByTokens<FloatDecode, DType::kBF16>(n_tokens, w, x, n_tokens, y, stream);
    case DType::kQ8_0:
    case DType::kQ4_0:
      break;
    default:
      return;  // not a dense weight dtype (the loader rejects it before)
  }
  if (FusedFits(w.dtype, n_tokens, w.cols)) {
    const Product one{&w, y};
    return FusedProduct(std::span(&one, 1), x, n_tokens, stream);
  }
  // Quantized weights: quantize x into scratch, in chunks of at most kMaxDecodeTokens tokens.
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxDecodeTokens) {
    const int64_t nt = n_tokens - t0 < kMaxDecodeTokens ? n_tokens - t0 : kMaxDecodeTokens;
    const Product part{&w, y + t0 * w.rows};
    QuantizedList(std::span(&part, 1), nt, QuantizeX(x + t0 * w.cols, nt, w.cols, stream), stream);
  }
}

QuantizedActs DenseMatMul::State::QuantizeX(const float* x, int64_t nt, int64_t cols,
                                            cudaStream_t stream) {
  const int64_t total = nt * (cols / 32);
  constexpr int kWarpsPerBlock = kElementThreads / kWarp;
  if (total > 0)
    Launch(QuantizeActivationsKernel, static_cast<unsigned>(CeilDiv(total, kWarpsPerBlock)),
           kElementThreads, 0, stream, x, total, xq, dx);
  return QuantizedActs{xq, dx};
}

void DenseMatMul::State::QuantizedList(std::span<const Product> products, int64_t nt,
                                       const QuantizedActs& x8, cudaStream_t stream) {
  const MatrixList list = ListOf(products);
  const DeviceMatrix& w = *products.front().w;
  if (w.dtype == DType::kQ8_0) {
    ByTokens<QuantListDecode, DType::kQ8_0>(nt, list, w.cols, x8.q, x8.d, nt, stream);
  } else {
    ByTokens<QuantListDecode, DType::kQ4_0>(nt, list, w.cols, x8.q, x8.d, nt, stream);
  }
}

void DenseMatMul::State::FusedProduct(std::span<const Product> products, const float* x, int64_t nt,
                                      cudaStream_t stream) {
  const MatrixList list = ListOf(products);
  const DeviceMatrix& w = *products.front().w;
  if (w.dtype == DType::kQ8_0) {
    ByTokens<FusedQuantDecode, DType::kQ8_0>(nt, list, w.cols, x, nt, sm_count, stream);
  } else {
    ByTokens<FusedQuantDecode, DType::kQ4_0>(nt, list, w.cols, x, nt, sm_count, stream);
  }
}

void DenseMatMul::State::FloatListProduct(std::span<const Product> products, const float* x,
                                          int64_t n_tokens, cudaStream_t stream) {
  const MatrixList list = ListOf(products);
  const DeviceMatrix& w = *products.front().w;
  switch (w.dtype) {
    case DType::kF32:
      return ByTokens<FloatListDecode, DType::kF32>(n_tokens, list, w.cols, x, n_tokens, stream);
    case DType::kF16:
      return ByTokens<FloatListDecode, DType::kF16>(n_tokens, list, w.cols, x, n_tokens, stream);
    default:
      return ByTokens<FloatListDecode, DType::kBF16>(n_tokens, list, w.cols, x, n_tokens, stream);
  }
}

void DenseMatMul::RunAll(std::span<const Product> products, const float* x, int64_t n_tokens,
                         cudaStream_t stream, const QuantizedActs* x8) {
  if (products.empty() || n_tokens <= 0) return;
  const DeviceMatrix& first = *products.front().w;
  const bool quantized = IsBlockQuantized(first.dtype);
  const bool float_dtype =
      first.dtype == DType::kF32 || first.dtype == DType::kF16 || first.dtype == DType::kBF16;
  // One x for all: the same dtype and width, decode-sized, and (float formats) every matrix
  // readable by the vectorized kernel.
  bool together = n_tokens <= kMaxDecodeTokens && (quantized || float_dtype);
  for (const Product& p : products)
    together = together && p.w->dtype == first.dtype && p.w->cols == first.cols && p.w->rows > 0 &&
               (quantized || FloatVectorizable(*p.w, x));
  const bool listable = together && products.size() <= static_cast<size_t>(kMaxListed);
  if (listable && float_dtype) return s_->FloatListProduct(products, x, n_tokens, stream);
  if (listable && quantized && x8 != nullptr)
    return s_->QuantizedList(products, n_tokens, *x8, stream);
  if (listable && FusedFits(first.dtype, n_tokens, first.cols))
    return s_->FusedProduct(products, x, n_tokens, stream);
  if (!together || !quantized) {
    for (const Product& p : products) Run(*p.w, x, n_tokens, p.y, stream, x8);
    return;
  }
  const QuantizedActs mine = x8 != nullptr ? *x8 : s_->QuantizeX(x, n_tokens, first.cols, stream);
  if (listable) return s_->QuantizedList(products, n_tokens, mine, stream);
  for (const Product& p : products) s_->QuantizedList(std::span(&p, 1), n_tokens, mine, stream);
}

// y[:, 0:n_rows] (row stride ldy) = x[n_tokens, cols] · w[n_rows, cols]ᵀ, fp32 output. cuBLAS
// is column-major: it sees w as [cols, n_rows] (ld cols), x as [cols, n_tokens] (ld cols) and y
// as [n_rows, n_tokens] (ld ldy), so y = op_T(w) · x with m = n_rows, n = n_tokens, k = cols.
void DenseMatMul::State::Gemm(cudaDataType type, const void* w, int64_t n_rows, int64_t cols,
                              const void* x, int64_t n_tokens, float* y, int64_t ldy,
                              cublasComputeType_t compute) {
  const float one = 1.0f;
  const float zero = 0.0f;
  blas->gemm_ex(cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_rows),
                static_cast<int>(n_tokens), static_cast<int>(cols), &one, w, type,
                static_cast<int>(cols), x, type, static_cast<int>(cols), &zero, y, CUDA_R_32F,
                static_cast<int>(ldy), compute, CUBLAS_GEMM_DEFAULT);
}

void DenseMatMul::State::Prefill(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y,
                                 cudaStream_t stream) {
  // cublasSetStream also resets the workspace to cuBLAS's own pool: set ours after it.
  blas->set_stream(cublas, stream);
  blas->set_workspace(cublas, workspace, kCublasWorkspaceBytes);
  const int64_t n_x = n_tokens * w.cols;
  switch (w.dtype) {
    case DType::kF32:  // TF32 tensor cores on the fp32 operands as they are
      return Gemm(CUDA_R_32F, w.data, w.rows, w.cols, x, n_tokens, y, w.rows,
                  CUBLAS_COMPUTE_32F_FAST_TF32);
    case DType::kF16:
      Launch(ToHalfKernel<true>, ElementGrid(n_x), kElementThreads, 0, stream, x, n_x, xh);
      return Gemm(CUDA_R_16F, w.data, w.rows, w.cols, xh, n_tokens, y, w.rows, CUBLAS_COMPUTE_32F);
    case DType::kBF16:
      Launch(ToHalfKernel<false>, ElementGrid(n_x), kElementThreads, 0, stream, x, n_x, xh);
      return Gemm(CUDA_R_16BF, w.data, w.rows, w.cols, xh, n_tokens, y, w.rows, CUBLAS_COMPUTE_32F);
    case DType::kQ8_0:
    case DType::kQ4_0:
      break;
    default:
      return;
  }
  Launch(ToHalfKernel<false>, ElementGrid(n_x), kElementThreads, 0, stream, x, n_x, xh);
  const int64_t row_bytes = static_cast<int64_t>(DTypeRowBytes(w.dtype, w.cols));
  const int64_t chunk_rows_max = wdq_elems / w.cols;
  if (chunk_rows_max < 1) return;  // w.cols > max_cols: outside the contract
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t r0 = 0; r0 < w.rows; r0 += chunk_rows_max) {
    const int64_t n_rows = w.rows - r0 < chunk_rows_max ? w.rows - r0 : chunk_rows_max;
    const int grid = ElementGrid(n_rows * w.cols);
    if (w.dtype == DType::kQ8_0) {
      Launch(DequantToBf16Kernel<DType::kQ8_0>, grid, kElementThreads, 0, stream,
             data + r0 * row_bytes, n_rows, w.cols, wdq);
    } else {
      Launch(DequantToBf16Kernel<DType::kQ4_0>, grid, kElementThreads, 0, stream,
             data + r0 * row_bytes, n_rows, w.cols, wdq);
    }
    Gemm(CUDA_R_16BF, wdq, n_rows, w.cols, xh, n_tokens, y + r0, w.rows, CUBLAS_COMPUTE_32F);
  }
}

}  // namespace moetier::cuda
