// Matrix products y[T, N] = x[T, K] · W[N, K]ᵀ of float32 activations with weights stored as
// f32, f16, bf16 (fp32 arithmetic) or GGUF Q8_0 / Q4_0 blocks (activations quantized to 8 bits
// per 32-block, integer dots, per-block scales in fp32). Math only: no model knowledge.
//
// The instruction set is chosen at run time (cpu_isa.h); formats and dispatch are described in
// README.md beside this file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul_isa.h"

namespace moetier::kernels {

// dot(a, b) over n float32 elements.
float DotF32(const float* a, const float* b, int64_t n);

// Converts `n` elements of a weight tensor starting at flat element `offset` to f32: f32, f16,
// bf16, Q8_0 or Q4_0 (any offset and n: partial blocks are dequantized as needed).
void RowToF32(const TensorView& w, int64_t offset, int64_t n, float* out);

// Tokens from which the amx level packs activations for tiles (Q8_0 and BF16 weights; see
// matmul_amx_impl.h); smaller batches use its AVX-512 VNNI kernels, which sum in another order,
// so results are bit-identical across batch sizes only on one side of this number.
// MOETIER_AMX_MIN_TOKENS=N overrides the constant.
inline constexpr int64_t kPackMinTokens = 2;
int64_t PackMinTokens();

// How far ahead of a one-token bf16/bf16c/f16/f32 weight stream the AVX2 kernels prefetch (never
// past the end of the call's row range). The best distance differs by vendor: AMD CPUs without
// AVX-512 streamed fastest 1 KB ahead, AMD with AVX-512 4 KB, Intel Xeons 2 KB
// (docs/benchmarks.md, "settings"). So kFloatPrefetchBytesAmd on AMD CPUs without
// AVX-512, kFloatPrefetchBytesAmdAvx512 on those with it, kFloatPrefetchBytes elsewhere;
// MOETIER_FLOAT_PREFETCH_BYTES=N overrides (64 to 16384). Quantized formats prefetch 2 KB
// ahead on AVX2 (best on both machines) and 4 KB in the AVX-512 decode kernels.
inline constexpr int64_t kFloatPrefetchBytes = 2048;
inline constexpr int64_t kFloatPrefetchBytesAmd = 1024;
inline constexpr int64_t kFloatPrefetchBytesAmdAvx512 = 4096;
int64_t FloatStreamPrefetchBytes();
// Whether batches of `f`'s weights (bf16/f16/bf16c) convert their rows to float32 once for
// every tile of tokens to read (Prepared::convert_batch_rows) or convert them in registers tile
// by tile: in registers, the rows are read as they are stored (BF16C expanded to bf16 first,
// half the bytes of float32), at the cost of a conversion per tile. In registers on AMD CPUs
// (faster there at every batch size measured) and for bf16 rows elsewhere (faster on the Xeon
// too); f16 and bf16c rows off AMD are converted once (bf16c measured even on the Xeon, f16
// not measured). docs/tuning.md has the figures. MOETIER_CONVERT_BATCH_ROWS=0|1
// overrides.
bool ConvertBatchRows(isa::WFormat f);
// Quantized decode's prefetch distance: MOETIER_QUANT_PREFETCH_BYTES=N (64 to 16384), else 0,
// which lets each level use its own (2 KB AVX2, 4 KB AVX-512; Prepared::quant_prefetch_bytes).
int64_t QuantStreamPrefetchBytes();

// Tokens from which a BF16C product on an AVX-512 level runs that level's kernels: on kAmx /
// kAvx512Bf16 each task expands its rows to plain bf16 (kExpandRows at a time, so they stay in
// L2) for the bf16 dot instructions; on kAvx512 / kAvx512Vnni the fp32 tiles (4 rows x 3
// tokens, against the AVX2 level's 1 x 3) expand 4 rows at a time, to bf16 or to float32
// (ConvertBatchRows). Either way the rows are expanded once and the cost is shared by the
// batch's tokens. Fewer tokens (decode) stream the packed rows through the AVX2 kernels.
// MOETIER_BF16C_EXPAND_MIN_TOKENS=N overrides the constant.
inline constexpr int64_t kBf16cExpandMinTokens = 4;
int64_t Bf16cExpandMinTokens();

// Tokens from which PreparedActivations::Prepare(pool, ...) spreads its work over the pool (one
// task per 16 tokens); fewer are prepared on the caller, where a job's hand-off would cost more
// than it saves. MOETIER_PARALLEL_PREPARE_TOKENS=N overrides the constant.
inline constexpr int64_t kParallelPrepareTokens = 32;
int64_t ParallelPrepareTokens();

// Activations x[n_tokens, k] made ready, once per matmul, for products with one weight dtype on
// one instruction set: kept in place for f32/f16/bf16 weights (fp32 math), quantized to q8
// blocks for Q8_0/Q4_0 weights, rounded to bf16 for bf16 weights on kAvx512Bf16; on kAmx, a
// batch of Q8_0/BF16 activations is also packed into tile layout (matmul_isa.h).
//
// Contract: Prepare runs on one thread; afterwards any number of threads may call DotRows on
// it concurrently (it is read-only). Storage grows to the largest request and is reused, so
// steady-state use does not allocate. When the activations are used in place, x must stay alive
// and unchanged until the last DotRows returns.
class PreparedActivations {
 public:
  PreparedActivations() = default;
  PreparedActivations(PreparedActivations&&) noexcept = default;
  PreparedActivations& operator=(PreparedActivations&&) noexcept = default;
  PreparedActivations(const PreparedActivations&) = delete;
  PreparedActivations& operator=(const PreparedActivations&) = delete;

  // Whether to build the ISA's tile copy (the amx level, PackMinTokens tokens or more): kNone
  // for activations that are only a Gather source.
  enum class Tiles : uint8_t { kIfUseful, kNone };

  // x: [n_tokens, k] float32, row stride k. `w_dtype` must be a weight dtype (IsWeightDType) and,
  // when block-quantized, k a multiple of 32. `isa` must be supported (CpuSupports).
  void Prepare(const float* x, int64_t n_tokens, int64_t k, DType w_dtype,
               CpuIsa isa = ActiveCpuIsa(), Tiles tiles = Tiles::kIfUseful);
  // The same result, with the work spread over `pool` when there are ParallelPrepareTokens()
  // tokens or more: one task per 16 tokens quantizes them and packs their tile, which also
  // leaves the tiles spread over the cores' caches instead of in one core's (every task of the
  // matmul reads all of them). Call from outside a pool job.
  void Prepare(ThreadPool& pool, const float* x, int64_t n_tokens, int64_t k, DType w_dtype,
               CpuIsa isa = ActiveCpuIsa(), Tiles tiles = Tiles::kIfUseful);

  // Rows `tokens[0..n)` of an already prepared `src`, copied into this object's own storage
  // (also for formats used in place), in that order: the MoE executor quantizes a chunk's
  // tokens once and hands each expert the rows routed to it. Bit-identical to preparing the
  // gathered float rows, except that the copy keeps src's kernel_dtype() (a BF16C batch's few
  // gathered tokens still expand rows for the bf16 kernels) while its level follows its own
  // token count (BF16C rows with fewer than Bf16cExpandMinTokens tokens stream through the
  // AVX2 kernels: same layout, same results). `src` must outlive nothing: the copy is
  // independent.
  void Gather(const PreparedActivations& src, const int32_t* tokens, int64_t n);

  int64_t n_tokens() const { return view_.n_tokens; }
  int64_t k() const { return view_.k; }
  DType w_dtype() const { return w_dtype_; }
  // The weight dtype the prepared layout serves: w_dtype(), or kBF16 when BF16C rows are to be
  // expanded for the level's bf16 kernels (Bf16cExpandMinTokens).
  DType kernel_dtype() const { return kernel_dtype_; }
  CpuIsa isa() const { return isa_; }
  // The layout the ISA kernels read (matmul_isa.h); for tests.
  const isa::Prepared& view() const { return view_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  uint8_t* Reserve(size_t bytes);  // storage of at least `bytes` (contents not kept)
  int64_t PackedBytes() const;     // of the ISA's tile copy for view_, 0 if none
  // Prepare without the work: fixes view_ and the storage (records, then the tile copy).
  void Layout(const float* x, int64_t n_tokens, int64_t k, DType w_dtype, CpuIsa isa, Tiles tiles);
  // Prepare's work for tokens [t0, t1) (t0 a multiple of 16): their records and their tiles.
  void Fill(int64_t t0, int64_t t1);
  size_t packed_at_ = 0;  // offset of the tile copy in storage_ (when view_.packed is set)
  isa::Prepared view_;
  DType w_dtype_ = DType::kF32;
  DType kernel_dtype_ = DType::kF32;
  CpuIsa isa_ = CpuIsa::kScalar;
  CpuIsa asked_isa_ = CpuIsa::kScalar;             // the level Prepare was asked for (supported)
  std::unique_ptr<uint8_t, FreeDeleter> storage_;  // kAlign-aligned
  size_t capacity_ = 0;
};

// y[t * y_stride + r] = dot(x[t, :], w[r, :]) for t < x.n_tokens() and r in [row_begin, row_end),
// with w [n_rows, k] of dtype x.w_dtype(). Runs on the calling thread; each weight row is read
// once for all tokens. Every output element is computed the same way whatever the row range, so
// splitting rows across threads cannot change any result bit.
void DotRows(const TensorView& w, int64_t row_begin, int64_t row_end, const PreparedActivations& x,
             float* y, int64_t y_stride);

// y[t, r] = dot(x[t, :], w[r, :]) for t < n_tokens and rows r in [row_begin, row_end), where
// w is [n_rows, k] and x is [n_tokens, k] (row stride k). y has row stride y_stride.
// Prepares x on every call (into this thread's reusable storage) and then runs DotRows: to
// split one matmul across threads, Prepare once and call DotRows instead.
void MatMulRows(const float* x, int64_t n_tokens, const TensorView& w, int64_t row_begin,
                int64_t row_end, float* y, int64_t y_stride);

// Several products of the same activations, y_i[n_tokens, n_rows_i] = x · w_iᵀ (e.g. the
// q, k and v projections): x is prepared once per weight dtype and the rows of all w_i are cut
// into tasks of RowsPerTask rows, run by the pool in one job.
struct MatMulTarget {
  const TensorView* w;
  float* y;
};
void MatMulBatch(ThreadPool& pool, const float* x, int64_t n_tokens, const MatMulTarget* targets,
                 size_t n_targets);

// Rows per task when `n_rows` rows of `row_bytes` bytes (times `n_tokens` tokens) are split over
// `n_threads` threads: at least kMinTaskBytes of weights per task (so a task's cost dwarfs
// taking it) and about kTasksPerThread tasks per thread (so uneven progress evens out); a
// multiple of kTaskRowQuantum (whole kernel tiles; kAmxTaskRowQuantum when the active level
// runs the batch on AMX tiles, whose row blocks are 16 or 32 rows). MOETIER_TASK_ROWS=N
// overrides the result, MOETIER_TASKS_PER_THREAD=N the constant.
inline constexpr int64_t kMinTaskBytes = 64 << 10;
inline constexpr int64_t kTasksPerThread = 8;
inline constexpr int64_t kTaskRowQuantum = 4;
inline constexpr int64_t kAmxTaskRowQuantum = 32;
int64_t RowsPerTask(int64_t n_rows, int64_t row_bytes, int64_t n_tokens, int n_threads);

// y[n_tokens, n_rows] = x[n_tokens, k] · w[n_rows, k]ᵀ: prepares x once on the calling thread,
// then splits rows over the pool. Every output element is computed by one thread in a fixed
// order, so results do not depend on the number of threads.
void MatMul(ThreadPool& pool, const float* x, int64_t n_tokens, const TensorView& w, float* y);

}  // namespace moetier::kernels
