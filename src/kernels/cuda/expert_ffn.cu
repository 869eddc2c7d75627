// The routed experts on the GPU (expert_ffn.h). Two paths, both over all active experts of a
// step in one launch per projection, both reading the device routing on the device (no host
// sync, so a step can be captured in a CUDA graph):
//
// Decode (DecodeKernel): persistent blocks (one resident wave) walk work items (active expert,
// 16-row tile of each matrix); each item's rows stream through shared memory in column chunks of
// ~1 KiB a row, double-buffered with cp.async; each warp then takes 2 rows (x2 for gate and up)
// and dots them with up to 8 of the expert's tokens at once (fp32 FMA for bf16, dp4a on 8-bit
// activations for Q8_0/Q4_0), so every weight byte is read from HBM once per 8 tokens. Staging
// through shared memory lets the quantized formats (34- and 18-byte blocks, 2-byte aligned) load
// rows with 16-byte coalesced cp.async wherever a row starts 16-byte aligned (every real shape:
// d_model and width multiples of 256) and still decode block by block.
// Bandwidth: the design aims at ~80 % of the H200's 4.8 TB/s once a call has a few hundred
// items. As written it is bound by instruction throughput and latency (16 warps an SM: 120
// registers and 111 KiB of shared memory a block): measured on the H200, Mixtral-sized experts
// (4096 x 14336, one token) stream at 1.9 (Q4_0), 2.3 (Q8_0) and 3.1 (bf16) TB/s, and a
// Qwen3-30B-A3B decode token (8 experts of 2048 x 768, 7-24 MiB) takes 39-50 µs for the whole call.
//
// The smallest decode steps (GemvMaxAssignments, launch.h: one token at top-8) run instead a warp
// per output row (expert_ffn_gemv.cuh): the same arithmetic, so the same bits, over every SM at
// once, and Run's down launch adds the routed sum itself.
//
// Prefill: per active expert a grouped GEMM on tensor cores, the expert's token rows gathered
// (token_of). bf16 weights (GemmKernel): WMMA 16x16x16, bf16 operands split in two parts, fp32
// accumulation, 64 tokens x 64 rows a block. Q8_0/Q4_0 weights (Int8GemmKernel): the decode
// path's quantized activations against the weight codes on int8 MMAs (m16n8k32, one block's dot
// exact in int32), scaled and summed in fp32, 32 assignments x 128 weight rows a block; the
// weight blocks are staged in shared memory as they lie and unpacked into MMA fragments there.
//
// Both write per-assignment outputs (h, then y); RoutedSumKernel adds each token's y rows in its
// assign_of order (experts ascending) with fp32 FMA: fixed order, no atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/expert_ffn.h"
#include "kernels/cuda/expert_ffn_common.cuh"
#include "kernels/cuda/expert_ffn_decode.cuh"
#include "kernels/cuda/expert_ffn_gemv.cuh"
#include "kernels/cuda/expert_ffn_int8.cuh"
#include "kernels/cuda/expert_ffn_prefill.cuh"
#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {

namespace {

// The kernels and formats of expert_ffn_{common,decode,prefill,int8}.cuh.
using namespace expert_ffn;  // NOLINT(google-build-using-namespace)

// The step's tokens per expert (n_tokens * top_k / n_experts) from which Run takes the
// tensor-core path: where the GEMMs overtook the decode kernels (one read of an expert's rows
// per 8 tokens, CUDA-core multiply-adds) on the H200 with Qwen3-30B-A3B shapes (128 experts of
// 2048 x 768, top-8; ExpertFfnBench in tests/kernels/cuda/expert_ffn_test.cpp), ms a call,
// decode / GEMM: Q4_0 0.214 / 0.221 at 1 token per expert, 0.328 / 0.282 at 2; Q8_0 0.250 /
// 0.239 and 0.390 / 0.324; bf16 0.723 / 0.955 at 4, 1.297 / 0.982 at 8.
constexpr double kPrefillMinTokensPerExpertQuant = 1.5;
constexpr double kPrefillMinTokensPerExpertBf16 = 6.0;

// ---------------------------------------------------------------------------------------------
// The routed sum.

// out[t, c] = Σ over k < top_k, in order, of weight_of[j] * y[j, c], j = assign_of[t, k] (token
// t's assignments, experts ascending): fp32 FMA from 0, a fixed order; then + partial[t, c]
// when a partial sum is given. *n_active is copied to *active_record when that is not null.
__global__ void RoutedSumKernel(const float* y, const int32_t* assign_of, const float* weight_of,
                                int64_t n_tokens, int64_t top_k, int64_t d_model,
                                const float* partial, float* out, const int32_t* n_active,
                                int32_t* active_record) {
  PdlWait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx == 0 && active_record != nullptr) *active_record = *n_active;
  if (idx >= n_tokens * d_model) return;
  const int64_t t = idx / d_model, c = idx % d_model;
  float acc = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) {
    const int64_t j = assign_of[t * top_k + k];
    acc = fmaf(weight_of[j], y[j * d_model + c], acc);
  }
  out[idx] = partial != nullptr ? acc + partial[idx] : acc;
}

// The scratch of one ExpertFfn (its State), sized at Create.
struct CudaFree {
  void operator()(unsigned char* p) const { cudaFree(p); }
};

// The scratch of one ExpertFfn (its State): one allocation made at Create, carved into the
// buffers below (each 256-byte aligned). One cudaMalloc rather than a DeviceBuffer per buffer:
// DeviceBuffer::Create does not compile under nvcc 13 (its `return b;` into Expected needs the
// C++20 implicit move that nvcc's front end lacks).
struct Scratch {
  ExpertShape shape;
  ExpertFfnOptions options;
  int64_t x_q_stride = 0;         // bytes a row of quantized x: d_model rounded up to 16
  int64_t h_q_stride = 0;         // of quantized h: width rounded up to 16
  int decode_blocks_gate_up = 0;  // resident blocks of the decode kernels: their grid sizes
  int decode_blocks_down = 0;
  std::unique_ptr<unsigned char, CudaFree> memory;
  float* h = nullptr;     // [max_tokens * top_k, width]
  float* y = nullptr;     // [max_tokens * top_k, d_model]
  int8_t* x_q = nullptr;  // [max_tokens, x_q_stride]   (Q8_0/Q4_0 only)
  float* x_d = nullptr;   // [max_tokens, d_model / 32]
  int8_t* h_q = nullptr;  // [max_tokens * top_k, h_q_stride]
  float* h_d = nullptr;   // [max_tokens * top_k, width / 32]
};

constexpr int kElementwiseThreads = 256;

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Fmt FmtOf(DType t) {
  return t == DType::kQ8_0 ? Fmt::kQ8_0 : t == DType::kQ4_0 ? Fmt::kQ4_0 : Fmt::kBF16;
}

// fn.template operator()<F>() for the format F of dtype: where a runtime dtype picks the
// kernels' template.
template <typename Fn>
auto ByFmt(DType dtype, Fn&& fn) {
  switch (FmtOf(dtype)) {
    case Fmt::kQ8_0:
      return fn.template operator()<Fmt::kQ8_0>();
    case Fmt::kQ4_0:
      return fn.template operator()<Fmt::kQ4_0>();
    default:
      return fn.template operator()<Fmt::kBF16>();
  }
}

// Lets the decode kernels of format F use their shared memory (over the 48 KiB default, with
// the carveout at its largest so that two blocks fit an SM) and returns how many blocks of
// each are resident on the whole device at once: the size of their persistent grids.
template <Fmt F, int kMats>
Status PrepareDecodeKernel(int& resident_blocks) {
  const auto kernel = DecodeKernel<F, kMats>;
  const std::string what =
      kMats == 2 ? "ExpertFfn: the gate+up decode kernel" : "ExpertFfn: the down decode kernel";
  MT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               DecodeSmemBytes(F, kMats)),
                          what + " (shared memory)");
  MT_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared),
      what + " (carveout)");
  int device = 0, n_sms = 0, per_sm = 0;
  MT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), what);
  MT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device),
                          what);
  MT_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                              &per_sm, kernel, kDecodeThreads, DecodeSmemBytes(F, kMats)),
                          what + " (occupancy)");
  resident_blocks = std::max(1, n_sms * per_sm);
  return OkStatus();
}

template <Fmt F>
Status PrepareDecodeKernels(Scratch& s) {
  MT_RETURN_IF_ERROR((PrepareDecodeKernel<F, 2>(s.decode_blocks_gate_up)));
  return PrepareDecodeKernel<F, 1>(s.decode_blocks_down);
}

Status ValidateShape(const ExpertShape& shape, int64_t max_tokens, int64_t top_k) {
  const std::string dims =
      "d_model " + std::to_string(shape.d_model) + ", width " + std::to_string(shape.width);
  if (shape.dtype != DType::kBF16 && !IsBlockQuantized(shape.dtype))
    return Status::Error("ExpertFfn: expert dtype " + std::string(DTypeName(shape.dtype)) +
                         " is not supported on the GPU (BF16, Q8_0 or Q4_0)");
  if (shape.d_model <= 0 || shape.width <= 0)
    return Status::Error("ExpertFfn: expert shape (" + dims + ") must be positive");
  const int64_t multiple = shape.dtype == DType::kBF16 ? 2 : kQBlock;
  if (shape.d_model % multiple != 0 || shape.width % multiple != 0)
    return Status::Error("ExpertFfn: " + std::string(DTypeName(shape.dtype)) + " experts need " +
                         dims + " to be multiples of " + std::to_string(multiple));
  if (max_tokens <= 0 || top_k <= 0 || max_tokens * top_k > INT32_MAX)
    return Status::Error("ExpertFfn: max_tokens " + std::to_string(max_tokens) + " and top_k " +
                         std::to_string(top_k) + " must be positive, their product < 2^31");
  return OkStatus();
}

// Queues q/d = x [n_rows, n_cols] quantized per 32-block (n_rows > 0).
void QuantizeRows(const float* x, int64_t n_rows, int64_t n_cols, int8_t* q, int64_t q_stride,
                  float* d, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = kElementwiseThreads / kWarp;
  const int64_t n_blocks = n_rows * (n_cols / kQBlock);
  Launch(QuantizeRowsKernel, static_cast<unsigned>(CeilDiv(n_blocks, kWarpsPerBlock)),
         kElementwiseThreads, 0, stream, x, n_rows, n_cols, q, q_stride, d);
}

DecodeArgs DecodeArgsFor(const DeviceRouting& r, const ExpertPointers* table, int64_t rows,
                         int64_t cols, const int32_t* token_of, float* out) {
  DecodeArgs p;
  p.n_active = r.n_active;
  p.experts = r.experts;
  p.begin = r.begin;
  p.token_of = token_of;
  p.table = table;
  p.rows = rows;
  p.cols = cols;
  p.out = out;
  return p;
}

// Blocks of a decode launch over `rows` rows: one resident wave, or fewer where the step has
// fewer work items (16-row tiles of the most experts it can activate).
unsigned DecodeGrid(int resident_blocks, const DeviceRouting& r, int64_t rows) {
  const int64_t items = r.max_active() * CeilDiv(rows, kDecodeRows);
  return static_cast<unsigned>(std::min<int64_t>(resident_blocks, items));
}

// Whether a decode-path step runs on the one-warp-a-row kernels (expert_ffn_gemv.cuh,
// DecodeKernel's results bit for bit): few assignments (GemvMaxAssignments, launch.h: a step of 8
// has only ~100 of DecodeKernel's 16-row tiles for 132 SMs), top-k at most a warp's lanes (the
// summing down kernel's lane each), and for bf16 whole 8-weight units and 16-byte aligned
// activations.
bool UsesGemv(const Scratch& s, const DeviceRouting& r, const float* x) {
  if (r.n_assignments() > GemvMaxAssignments() || r.top_k > kWarp) return false;
  return s.shape.dtype != DType::kBF16 || (s.shape.d_model % 8 == 0 && s.shape.width % 8 == 0 &&
                                           reinterpret_cast<uintptr_t>(x) % 16 == 0);
}

// Where gate+up finds x quantized (Q8_0/Q4_0): x8 when the caller has it (rows of d_model),
// else the scratch, which QuantizeRows fills first. Returns whether that launch was queued.
bool QuantizedX(Scratch& s, const DeviceRouting& r, const float* x, const QuantizedActs* x8,
                cudaStream_t stream, const int8_t** q, const float** d, int64_t* q_stride) {
  if (x8 != nullptr) {
    *q = x8->q, *d = x8->d, *q_stride = s.shape.d_model;
    return false;
  }
  QuantizeRows(x, r.n_tokens, s.shape.d_model, s.x_q, s.x_q_stride, s.x_d, stream);
  *q = s.x_q, *d = s.x_d, *q_stride = s.x_q_stride;
  return true;
}

// The GEMV kernels' gate+up: h, and for Q8_0/Q4_0 h quantized after it, x quantized before it
// unless the caller handed it over. Returns the arguments for the down launch.
template <Fmt F>
GemvArgs RunGemvGateUp(Scratch& s, const DeviceRouting& r, const ExpertPointers* table,
                       const float* x, const QuantizedActs* x8, cudaStream_t stream) {
  GemvArgs p;
  p.r = r;
  p.table = table;
  p.d_model = s.shape.d_model;
  p.width = s.shape.width;
  p.x = x;
  p.h = s.h;
  p.y = s.y;
  bool routing_two_back = false;
  if constexpr (F != Fmt::kBF16) {
    routing_two_back = QuantizedX(s, r, x, x8, stream, &p.x_q, &p.x_d, &p.x_q_stride);
    p.h_q = s.h_q, p.h_d = s.h_d, p.h_q_stride = s.h_q_stride;
  }
  // After x's quantizing the routing lies two launches back (launch.cuh).
  p.rows_before_wait = routing_two_back && PrefetchWeights();
  const int64_t warps = r.n_assignments() * CeilDiv(p.width, kGemvGateUpRows);
  Launch(GemvGateUpKernel<F>, static_cast<unsigned>(CeilDiv(warps, kGemvWarps)), kGemvThreads,
         GemvSmemBytes(F, 2), stream, p);
  if constexpr (F != Fmt::kBF16)
    QuantizeRows(s.h, r.n_assignments(), p.width, s.h_q, s.h_q_stride, s.h_d, stream);
  return p;
}

// The GEMV kernels' down: y per assignment, or (kSum) each token's routed sum into p.out.
template <Fmt F, bool kSum>
void LaunchGemvDown(GemvArgs p, cudaStream_t stream) {
  const int64_t rows = (kSum ? p.r.n_tokens : p.r.n_assignments()) * p.d_model;
  p.rows_before_wait = PrefetchWeights();  // the routing lies two launches back, before gate+up
  Launch(GemvDownKernel<F, kSum>, static_cast<unsigned>(CeilDiv(rows, kGemvWarps)), kGemvThreads,
         GemvSmemBytes(F, kSum ? kGemvDownRows : 1), stream, p);
}

// Gate+up then down on the decode kernels: h, then y. Activations quantized once each for
// Q8_0/Q4_0 (x before gate+up unless x8 holds it, h before down).
template <Fmt F>
void RunDecode(Scratch& s, const DeviceRouting& r, const ExpertPointers* table, const float* x,
               const QuantizedActs* x8, cudaStream_t stream) {
  if (UsesGemv(s, r, x))
    return LaunchGemvDown<F, false>(RunGemvGateUp<F>(s, r, table, x, x8, stream), stream);
  const int64_t d_model = s.shape.d_model, width = s.shape.width;
  DecodeArgs up = DecodeArgsFor(r, table, width, d_model, r.token_of, s.h);
  DecodeArgs down = DecodeArgsFor(r, table, d_model, width, nullptr, s.y);
  if constexpr (F == Fmt::kBF16) {
    up.act = x;
    down.act = s.h;
  } else {
    (void)QuantizedX(s, r, x, x8, stream, &up.act_q, &up.act_d, &up.q_stride);
    down.act_q = s.h_q, down.act_d = s.h_d, down.q_stride = s.h_q_stride;
  }
  Launch(DecodeKernel<F, 2>, DecodeGrid(s.decode_blocks_gate_up, r, width), kDecodeThreads,
         DecodeSmemBytes(F, 2), stream, up);
  if constexpr (F != Fmt::kBF16)
    QuantizeRows(s.h, r.n_assignments(), width, s.h_q, s.h_q_stride, s.h_d, stream);
  Launch(DecodeKernel<F, 1>, DecodeGrid(s.decode_blocks_down, r, d_model), kDecodeThreads,
         DecodeSmemBytes(F, 1), stream, down);
}

// Gate+up then down as tensor-core grouped GEMMs: h, then y. Q8_0/Q4_0 quantize their
// activations once each, as the decode path does (x before gate+up, h before down).
template <Fmt F>
void RunPrefill(Scratch& s, const DeviceRouting& r, const ExpertPointers* table, const float* x,
                cudaStream_t stream) {
  const int64_t d_model = s.shape.d_model, width = s.shape.width;
  const auto n_active = static_cast<unsigned>(r.max_active());
  if constexpr (F == Fmt::kBF16) {
    // No expert has more assignments than there are tokens (a token picks an expert once).
    const auto m_tiles = static_cast<unsigned>(CeilDiv(r.n_tokens, kGemmM));
    GemmArgs up{r.n_active, r.experts, r.begin, r.token_of, table, width, d_model, x, s.h};
    Launch(GemmKernel<2>, dim3(static_cast<unsigned>(CeilDiv(width, kGemmN)), m_tiles, n_active),
           kGemmThreads, 0, stream, up);
    GemmArgs down{r.n_active, r.experts, r.begin, nullptr, table, d_model, width, s.h, s.y};
    Launch(GemmKernel<1>, dim3(static_cast<unsigned>(CeilDiv(d_model, kGemmN)), m_tiles, n_active),
           kGemmThreads, 0, stream, down);
  } else {
    const auto m_tiles = static_cast<unsigned>(CeilDiv(r.n_tokens, kI8M));
    QuantizeRows(x, r.n_tokens, d_model, s.x_q, s.x_q_stride, s.x_d, stream);
    const Int8GemmArgs up{r.n_active, r.experts, r.begin, r.token_of,   table, width,
                          d_model,    s.x_q,     s.x_d,   s.x_q_stride, s.h};
    Launch(Int8GemmKernel<F, 2>,
           dim3(static_cast<unsigned>(CeilDiv(width, kI8BRows / 2)), m_tiles, n_active), kI8Threads,
           0, stream, up);
    QuantizeRows(s.h, r.n_assignments(), width, s.h_q, s.h_q_stride, s.h_d, stream);
    const Int8GemmArgs down{r.n_active, r.experts, r.begin, nullptr,      table, d_model,
                            width,      s.h_q,     s.h_d,   s.h_q_stride, s.y};
    Launch(Int8GemmKernel<F, 1>,
           dim3(static_cast<unsigned>(CeilDiv(d_model, kI8BRows)), m_tiles, n_active), kI8Threads,
           0, stream, down);
  }
}

// Carves s's buffers out of one allocation for max_tokens tokens, n_assign assignments.
Status AllocateScratch(Scratch& s, int64_t max_tokens, int64_t n_assign) {
  constexpr int64_t kAlign = 256;
  const bool quant = s.x_q_stride > 0;
  const int64_t sizes[6] = {
      n_assign * s.shape.width * 4,
      n_assign * s.shape.d_model * 4,
      quant ? max_tokens * s.x_q_stride : 0,
      quant ? max_tokens * (s.shape.d_model / kQBlock) * 4 : 0,
      quant ? n_assign * s.h_q_stride : 0,
      quant ? n_assign * (s.shape.width / kQBlock) * 4 : 0,
  };
  int64_t offsets[6], total = 0;
  for (int i = 0; i < 6; ++i) {
    offsets[i] = total;
    total += CeilDiv(sizes[i], kAlign) * kAlign;
  }
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(total));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: later calls must not see it
    return CudaStatus(err, "ExpertFfn: allocating " + std::to_string(total) +
                               " bytes of VRAM for the experts' scratch");
  }
  s.memory.reset(static_cast<unsigned char*>(p));
  unsigned char* base = s.memory.get();
  s.h = reinterpret_cast<float*>(base + offsets[0]);
  s.y = reinterpret_cast<float*>(base + offsets[1]);
  if (quant) {
    s.x_q = reinterpret_cast<int8_t*>(base + offsets[2]);
    s.x_d = reinterpret_cast<float*>(base + offsets[3]);
    s.h_q = reinterpret_cast<int8_t*>(base + offsets[4]);
    s.h_d = reinterpret_cast<float*>(base + offsets[5]);
  }
  return OkStatus();
}

bool UsePrefill(ExpertFfnPath path, DType dtype, const DeviceRouting& r) {
  if (path != ExpertFfnPath::kAuto) return path == ExpertFfnPath::kPrefill;
  const double tokens_per_expert =
      static_cast<double>(r.n_assignments()) / static_cast<double>(r.n_experts);
  return tokens_per_expert >=
         (dtype == DType::kBF16 ? kPrefillMinTokensPerExpertBf16 : kPrefillMinTokensPerExpertQuant);
}

template <Fmt F>
void RunFmt(Scratch& s, const DeviceRouting& r, const ExpertPointers* table, const float* x,
            const QuantizedActs* x8, cudaStream_t stream) {
  if (UsePrefill(s.options.path, s.shape.dtype, r)) {
    RunPrefill<F>(s, r, table, x, stream);
  } else {
    RunDecode<F>(s, r, table, x, x8, stream);
  }
}

}  // namespace

struct ExpertFfn::State : Scratch {};

Expected<ExpertFfn> ExpertFfn::Create(const ExpertShape& shape, int64_t max_tokens, int64_t top_k,
                                      const ExpertFfnOptions& options) {
  MT_RETURN_IF_ERROR(ValidateShape(shape, max_tokens, top_k));
  auto s = std::make_unique<State>();
  s->shape = shape;
  s->options = options;
  const Fmt f = FmtOf(shape.dtype);
  if (f != Fmt::kBF16) {
    s->x_q_stride = CeilDiv(shape.d_model, 16) * 16;
    s->h_q_stride = CeilDiv(shape.width, 16) * 16;
  }
  MT_RETURN_IF_ERROR(AllocateScratch(*s, max_tokens, max_tokens * top_k));
  MT_RETURN_IF_ERROR(ByFmt(shape.dtype, [&]<Fmt F>() { return PrepareDecodeKernels<F>(*s); }));
  ExpertFfn ffn;
  ffn.s_ = std::move(s);
  return Expected<ExpertFfn>(std::move(ffn));
}

ExpertFfn::ExpertFfn() = default;
ExpertFfn::~ExpertFfn() = default;
ExpertFfn::ExpertFfn(ExpertFfn&&) noexcept = default;
ExpertFfn& ExpertFfn::operator=(ExpertFfn&&) noexcept = default;

void ExpertFfn::Run(const DeviceRouting& r, const ExpertPointers* table, const float* x, float* out,
                    cudaStream_t stream, int32_t* active_record, const QuantizedActs* x8) {
  Scratch& s = *s_;
  if (r.n_tokens == 0) return;
  if (UsePrefill(s.options.path, s.shape.dtype, r) || !UsesGemv(s, r, x)) {
    RunExperts(r, table, x, stream, x8);
    return RoutedSum(r, nullptr, out, stream, active_record);
  }
  // The down launch sums each token's products itself: no routed-sum launch.
  ByFmt(s.shape.dtype, [&]<Fmt F>() {
    GemvArgs p = RunGemvGateUp<F>(s, r, table, x, x8, stream);
    p.out = out;
    p.active_record = active_record;
    LaunchGemvDown<F, true>(p, stream);
  });
}

void ExpertFfn::RunExperts(const DeviceRouting& r, const ExpertPointers* table, const float* x,
                           cudaStream_t stream, const QuantizedActs* x8) {
  if (r.n_tokens == 0) return;
  Scratch& s = *s_;
  ByFmt(s.shape.dtype, [&]<Fmt F>() { RunFmt<F>(s, r, table, x, x8, stream); });
}

void ExpertFfn::RoutedSum(const DeviceRouting& r, const float* partial, float* out,
                          cudaStream_t stream, int32_t* active_record) {
  if (r.n_tokens == 0) return;
  const Scratch& s = *s_;
  const int64_t n_out = r.n_tokens * s.shape.d_model;
  Launch(RoutedSumKernel, static_cast<unsigned>(CeilDiv(n_out, kElementwiseThreads)),
         kElementwiseThreads, 0, stream, s.y, r.assign_of, r.weight_of, r.n_tokens, r.top_k,
         s.shape.d_model, partial, out, r.n_active, active_record);
}

}  // namespace moetier::cuda
