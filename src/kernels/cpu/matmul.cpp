#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/tuning.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/quant.h"

namespace moetier::kernels {

namespace {

const isa::Kernels* KernelsFor(CpuIsa cpu_isa) {
  switch (cpu_isa) {
    case CpuIsa::kScalar:
      return isa::ScalarKernels();
    case CpuIsa::kAvx2:
      return isa::Avx2Kernels();
    case CpuIsa::kAvxVnni:
      return isa::AvxVnniKernels();
    case CpuIsa::kAvx512:
      return isa::Avx512Kernels();
    case CpuIsa::kAvx512Vnni:
      return isa::Avx512VnniKernels();
    case CpuIsa::kAvx512Bf16:
      return isa::Avx512Bf16Kernels();
    case CpuIsa::kAmx:
      return isa::AmxKernels();
  }
  return nullptr;
}

isa::WFormat FormatOf(DType t) {
  switch (t) {
    case DType::kF16:
      return isa::WFormat::kF16;
    case DType::kBF16:
      return isa::WFormat::kBF16;
    case DType::kQ8_0:
      return isa::WFormat::kQ8_0;
    case DType::kQ4_0:
      return isa::WFormat::kQ4_0;
    case DType::kBF16C:
      return isa::WFormat::kBF16C;
    default:
      return isa::WFormat::kF32;
  }
}

// Per-thread aligned scratch that grows once and is then reused (no allocation per call).
class ThreadScratch {
 public:
  ~ThreadScratch() { std::free(p_); }
  float* Floats(int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (bytes > size_) {
      std::free(p_);
      size_ = isa::RoundUp(static_cast<int64_t>(bytes), isa::kAlign);
      p_ = std::aligned_alloc(isa::kAlign, size_);
    }
    return static_cast<float*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

// The dtype whose kernels run weights of dtype `w` for n_tokens tokens on `cpu_isa`: BF16C
// batches on levels with bf16 dot instructions go through their bf16 kernels on expanded rows.
DType KernelDType(DType w, CpuIsa cpu_isa, int64_t n_tokens) {
  const bool bf16_dots = cpu_isa == CpuIsa::kAmx || cpu_isa == CpuIsa::kAvx512Bf16;
  if (w == DType::kBF16C && bf16_dots && n_tokens >= Bf16cExpandMinTokens() &&
      CpuSupports(CpuIsa::kAvx2))
    return DType::kBF16;
  return w;
}

// The level that runs kernel dtype `w` for n_tokens tokens when `cpu_isa` is asked for: BF16C's
// slot order is the AVX2 kernels' (matmul_isa.h), so every SIMD level hands it to them, but
// for batches on kAvx512 / kAvx512Vnni: their fp32 tiles (4 rows x 3 tokens, against AVX2's
// 1 x 3) run on rows the AVX2 code decodes to float32, with the same results bit for bit.
CpuIsa IsaForWeights(DType w, CpuIsa cpu_isa, int64_t n_tokens) {
  if (w != DType::kBF16C || cpu_isa == CpuIsa::kScalar || !CpuSupports(CpuIsa::kAvx2))
    return cpu_isa;
  const bool fp32_tiles = cpu_isa == CpuIsa::kAvx512 || cpu_isa == CpuIsa::kAvx512Vnni;
  return fp32_tiles && n_tokens >= Bf16cExpandMinTokens() ? cpu_isa : CpuIsa::kAvx2;
}

// DotRows for BF16C rows and activations prepared for bf16 (KernelDType): kExpandRows rows at a
// time expanded into this thread's buffer, then the level's bf16 kernels. Each output element's
// arithmetic is the bf16 kernels', which do not depend on the row range.
void ExpandedBf16cRows(const TensorView& w, int64_t row_begin, int64_t row_end,
                       const PreparedActivations& x, float* y, int64_t y_stride, float* scratch) {
  constexpr int64_t kExpandRows = 32;  // one AMX row block; 128 KB of bf16 for k = 2048
  const int64_t k = x.k();
  const size_t row_bytes = DTypeRowBytes(DType::kBF16C, k);
  thread_local std::vector<uint16_t> rows;
  rows.resize(static_cast<size_t>(kExpandRows * k));  // grows once per thread
  const isa::Kernels& kern = SafeKernels(x.isa());
  const auto stop =
      reinterpret_cast<uintptr_t>(w.bytes() + static_cast<size_t>(row_end) * row_bytes);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kExpandRows) {
    const int64_t n = std::min(kExpandRows, row_end - r0);
    isa::Avx2ExpandBf16cRows(w.bytes() + static_cast<size_t>(r0) * row_bytes,
                             static_cast<int64_t>(row_bytes), n, k, rows.data(),
                             x.view().float_prefetch_bytes, stop);
    kern.dot_rows(isa::WFormat::kBF16, reinterpret_cast<const uint8_t*>(rows.data()), 2 * k, 0, n,
                  x.view(), y + r0, y_stride, scratch);
  }
}

}  // namespace

const isa::Kernels& SafeKernels(CpuIsa cpu_isa) {
  const isa::Kernels* k = CpuSupports(cpu_isa) ? KernelsFor(cpu_isa) : nullptr;
  return k != nullptr ? *k : *isa::ScalarKernels();
}

float DotF32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void RowToF32(const TensorView& w, int64_t offset, int64_t n, float* out) {
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, w.as<float>() + offset, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* src = w.as<uint16_t>() + offset;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(&out[i], &bits, sizeof(float));
      }
      return;
    }
    case DType::kF16: {
      const uint16_t* src = w.as<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(src[i]);
      return;
    }
    case DType::kQ8_0:
    case DType::kQ4_0: {
      // Rows are whole blocks, so flat element e lives in block e / 32 of the whole tensor.
      const size_t block_bytes = DTypeBlockBytes(w.dtype);
      float block[kQuantBlock];
      for (int64_t e = offset; e < offset + n;) {
        const int64_t b = e / kQuantBlock, first = e - b * kQuantBlock;
        const int64_t take = std::min<int64_t>(kQuantBlock - first, offset + n - e);
        const uint8_t* src = w.bytes() + static_cast<size_t>(b) * block_bytes;
        if (w.dtype == DType::kQ8_0) {
          DequantizeRowQ8_0(src, kQuantBlock, block);
        } else {
          DequantizeRowQ4_0(src, kQuantBlock, block);
        }
        std::memcpy(out + (e - offset), block + first, static_cast<size_t>(take) * sizeof(float));
        e += take;
      }
      return;
    }
    case DType::kBF16C: {
      // Rows carry a header: decode each row the range touches (into `out` when whole).
      const int64_t k = w.shape.back();
      const size_t row_bytes = DTypeRowBytes(DType::kBF16C, k);
      std::vector<float> part;
      for (int64_t e = offset; e < offset + n;) {
        const int64_t r = e / k, first = e - r * k;
        const int64_t take = std::min<int64_t>(k - first, offset + n - e);
        const uint8_t* row = w.bytes() + static_cast<size_t>(r) * row_bytes;
        if (take == k) {
          isa::Bf16cRowToF32(row, k, out + (e - offset));
        } else {
          part.resize(static_cast<size_t>(k));
          isa::Bf16cRowToF32(row, k, part.data());
          std::memcpy(out + (e - offset), part.data() + first,
                      static_cast<size_t>(take) * sizeof(float));
        }
        e += take;
      }
      return;
    }
    default:
      // Loaders only admit weight dtypes; reaching here is a programming error.
      std::memset(out, 0, static_cast<size_t>(n) * sizeof(float));
  }
}

void PreparedActivations::FreeDeleter::operator()(uint8_t* p) const {
  std::free(p);
}

int64_t PackMinTokens() {
  return Tuning().amx_min_tokens.value_or(kPackMinTokens);
}

int64_t Bf16cExpandMinTokens() {
  return Tuning().bf16c_expand_min_tokens.value_or(kBf16cExpandMinTokens);
}

bool ConvertBatchRows(isa::WFormat f) {
  if (Tuning().convert_batch_rows) return *Tuning().convert_batch_rows == 1;
  static const bool amd = CpuIsAmd();
  return !amd && f != isa::WFormat::kBF16;
}

int64_t FloatStreamPrefetchBytes() {
  static const int64_t bytes = [] {
    if (Tuning().float_prefetch_bytes) return *Tuning().float_prefetch_bytes;
    if (!CpuIsAmd()) return kFloatPrefetchBytes;
    return CpuSupports(CpuIsa::kAvx512) ? kFloatPrefetchBytesAmdAvx512 : kFloatPrefetchBytesAmd;
  }();
  return bytes;
}

int64_t QuantStreamPrefetchBytes() {
  return Tuning().quant_prefetch_bytes.value_or(0);
}

uint8_t* PreparedActivations::Reserve(size_t bytes) {
  if (bytes > capacity_) {
    capacity_ = static_cast<size_t>(isa::RoundUp(static_cast<int64_t>(bytes), isa::kAlign));
    storage_.reset(static_cast<uint8_t*>(std::aligned_alloc(isa::kAlign, capacity_)));
  }
  return storage_.get();
}

int64_t PreparedActivations::PackedBytes() const {
  const isa::Kernels& kern = SafeKernels(isa_);
  if (kern.pack == nullptr || view_.n_tokens < PackMinTokens()) return 0;
  return kern.packed_bytes(FormatOf(kernel_dtype_), view_.n_tokens, view_.k);
}

int64_t ParallelPrepareTokens() {
  return Tuning().parallel_prepare_tokens.value_or(kParallelPrepareTokens);
}

void PreparedActivations::Layout(const float* x, int64_t n_tokens, int64_t k, DType w_dtype,
                                 CpuIsa cpu_isa, Tiles tiles) {
  assert(IsWeightDType(w_dtype) && IsValidRowLength(w_dtype, k));
  if (!CpuSupports(cpu_isa)) cpu_isa = CpuIsa::kScalar;  // see SafeKernels
  asked_isa_ = cpu_isa;
  kernel_dtype_ = KernelDType(w_dtype, cpu_isa, n_tokens);
  cpu_isa = IsaForWeights(kernel_dtype_, cpu_isa, n_tokens);
  const isa::Kernels& kern = SafeKernels(cpu_isa);
  const isa::WFormat f = FormatOf(kernel_dtype_);
  w_dtype_ = w_dtype;
  isa_ = cpu_isa;
  view_ = isa::Prepared{};
  view_.n_tokens = n_tokens;
  view_.k = k;
  view_.x = x;
  view_.token_bytes = kern.token_bytes(f, k);
  view_.group = f == isa::WFormat::kQ4_0 ? kern.q4_0_group : 1;
  view_.run = f == isa::WFormat::kQ4_0 ? kern.q4_0_run : 0;
  view_.float_prefetch_bytes = FloatStreamPrefetchBytes();
  view_.convert_batch_rows = ConvertBatchRows(f);
  view_.quant_prefetch_bytes = QuantStreamPrefetchBytes();
  const size_t records = static_cast<size_t>(
      isa::RoundUp(view_.token_bytes * n_tokens, isa::kAlign));  // 0 when used in place
  const int64_t packed = tiles == Tiles::kNone ? 0 : PackedBytes();
  if (records + static_cast<size_t>(packed) == 0) return;
  Reserve(records + static_cast<size_t>(packed));
  if (view_.token_bytes > 0) view_.data = storage_.get();
  if (packed > 0) {
    packed_at_ = records;
    view_.packed = storage_.get() + records;
  }
}

void PreparedActivations::Fill(int64_t t0, int64_t t1) {
  const isa::Kernels& kern = SafeKernels(isa_);
  const isa::WFormat f = FormatOf(kernel_dtype_);
  if (view_.token_bytes > 0)
    kern.prepare(f, view_.x + t0 * view_.k, t1 - t0, view_.k,
                 storage_.get() + t0 * view_.token_bytes);
  if (view_.packed != nullptr)
    kern.pack(f, view_, t0 / isa::kAmxTokens, (t1 + isa::kAmxTokens - 1) / isa::kAmxTokens,
              storage_.get() + packed_at_);
}

void PreparedActivations::Prepare(const float* x, int64_t n_tokens, int64_t k, DType w_dtype,
                                  CpuIsa cpu_isa, Tiles tiles) {
  Layout(x, n_tokens, k, w_dtype, cpu_isa, tiles);
  Fill(0, n_tokens);
}

void PreparedActivations::Prepare(ThreadPool& pool, const float* x, int64_t n_tokens, int64_t k,
                                  DType w_dtype, CpuIsa cpu_isa, Tiles tiles) {
  Layout(x, n_tokens, k, w_dtype, cpu_isa, tiles);
  if (n_tokens < ParallelPrepareTokens()) return Fill(0, n_tokens);
  if (view_.token_bytes == 0 && view_.packed == nullptr) return;  // used in place: no work
  const int64_t n_tiles = (n_tokens + isa::kAmxTokens - 1) / isa::kAmxTokens;
  pool.ParallelTasks(static_cast<size_t>(n_tiles), [&](size_t tile, int) {
    const int64_t t0 = static_cast<int64_t>(tile) * isa::kAmxTokens;
    Fill(t0, std::min(n_tokens, t0 + isa::kAmxTokens));
  });
}

void PreparedActivations::Gather(const PreparedActivations& src, const int32_t* tokens, int64_t n) {
  w_dtype_ = src.w_dtype_;
  kernel_dtype_ = src.kernel_dtype_;
  asked_isa_ = src.asked_isa_;
  isa_ = IsaForWeights(kernel_dtype_, asked_isa_, n);
  view_ = src.view_;
  view_.n_tokens = n;
  view_.packed = nullptr;
  // In-place formats read float rows: copy those; the others copy whole prepared records.
  const bool floats = src.view_.token_bytes == 0;
  const size_t record = floats ? static_cast<size_t>(src.view_.k) * sizeof(float)
                               : static_cast<size_t>(src.view_.token_bytes);
  const size_t records =
      static_cast<size_t>(isa::RoundUp(static_cast<int64_t>(record) * n, isa::kAlign));
  const int64_t packed = PackedBytes();
  Reserve(records + static_cast<size_t>(packed));
  const uint8_t* from = floats ? reinterpret_cast<const uint8_t*>(src.view_.x) : src.view_.data;
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(storage_.get() + static_cast<size_t>(i) * record,
                from + static_cast<size_t>(tokens[i]) * record, record);
  if (floats) {
    view_.x = reinterpret_cast<const float*>(storage_.get());
  } else {
    view_.data = storage_.get();
  }
  if (packed > 0) {
    packed_at_ = records;
    view_.packed = storage_.get() + records;
    const int64_t n_tiles = (n + isa::kAmxTokens - 1) / isa::kAmxTokens;
    SafeKernels(isa_).pack(FormatOf(kernel_dtype_), view_, 0, n_tiles, storage_.get() + records);
  }
}

void DotRows(const TensorView& w, int64_t row_begin, int64_t row_end, const PreparedActivations& x,
             float* y, int64_t y_stride) {
  const int64_t k = w.shape.back();
  assert(w.dtype == x.w_dtype() && k == x.k());
  if (row_begin >= row_end || x.n_tokens() == 0) return;
  if (k == 0) {
    for (int64_t t = 0; t < x.n_tokens(); ++t)
      for (int64_t r = row_begin; r < row_end; ++r) y[t * y_stride + r] = 0.0f;
    return;
  }
  thread_local ThreadScratch scratch;
  if (w.dtype != x.kernel_dtype())  // BF16C rows for bf16 kernels
    return ExpandedBf16cRows(w, row_begin, row_end, x, y, y_stride,
                             scratch.Floats(isa::ScratchFloats(k)));
  const isa::Kernels& kern = SafeKernels(x.isa());
  kern.dot_rows(FormatOf(w.dtype), w.bytes(), static_cast<int64_t>(DTypeRowBytes(w.dtype, k)),
                row_begin, row_end, x.view(), y, y_stride, scratch.Floats(isa::ScratchFloats(k)));
}

void MatMulRows(const float* x, int64_t n_tokens, const TensorView& w, int64_t row_begin,
                int64_t row_end, float* y, int64_t y_stride) {
  thread_local PreparedActivations prepared;
  prepared.Prepare(x, n_tokens, w.shape.back(), w.dtype);
  DotRows(w, row_begin, row_end, prepared, y, y_stride);
}

int64_t RowsPerTask(int64_t n_rows, int64_t row_bytes, int64_t n_tokens, int n_threads) {
  if (const auto forced = Tuning().task_rows)
    return std::min(*forced, std::max<int64_t>(1, n_rows));
  const int64_t row_cost = std::max<int64_t>(1, row_bytes * std::max<int64_t>(1, n_tokens));
  const int64_t for_bytes = (kMinTaskBytes + row_cost - 1) / row_cost;
  const int64_t tasks_per_thread = Tuning().tasks_per_thread.value_or(kTasksPerThread);
  const int64_t for_balance =
      n_rows / std::max<int64_t>(1, static_cast<int64_t>(n_threads) * tasks_per_thread);
  int64_t rows = std::max(for_bytes, for_balance);
  const int64_t quantum = ActiveCpuIsa() == CpuIsa::kAmx && n_tokens >= PackMinTokens()
                              ? kAmxTaskRowQuantum
                              : kTaskRowQuantum;
  rows = (rows + quantum - 1) / quantum * quantum;
  return std::max<int64_t>(1, std::min(rows, n_rows));
}

void MatMulBatch(ThreadPool& pool, const float* x, int64_t n_tokens, const MatMulTarget* targets,
                 size_t n_targets) {
  // The calling thread's storage, read by every worker until the job returns. (Named through a
  // reference: inside the lambda a thread_local name would mean the worker's own.) Two slots:
  // the targets' dtypes are at most two in practice (e.g. q8_0 projections, bf16 router).
  thread_local PreparedActivations tls_prepared[2];
  PreparedActivations* prepared = tls_prepared;
  constexpr size_t kMaxTargets = 8;
  assert(n_targets <= kMaxTargets);
  int slot_of[kMaxTargets];
  int n_slots = 0;
  int64_t total_rows = 0, max_row_bytes = 0;
  for (size_t i = 0; i < n_targets; ++i) {
    const TensorView& w = *targets[i].w;
    int s = 0;
    while (s < n_slots && prepared[s].w_dtype() != w.dtype) ++s;
    if (s == n_slots) {
      if (n_slots == 2) {  // a third dtype: run on its own after this job
        slot_of[i] = -1;
        continue;
      }
      prepared[n_slots++].Prepare(pool, x, n_tokens, w.shape.back(), w.dtype);
    }
    slot_of[i] = s;
    total_rows += w.shape.front();
    max_row_bytes = std::max<int64_t>(max_row_bytes,
                                      static_cast<int64_t>(DTypeRowBytes(w.dtype, w.shape.back())));
  }
  const int64_t rows_per_task = RowsPerTask(total_rows, max_row_bytes, n_tokens, pool.size());
  // Task t covers rows [first_row + j * rows_per_task, ...) of one target.
  int64_t first_task[kMaxTargets + 1];
  first_task[0] = 0;
  for (size_t i = 0; i < n_targets; ++i) {
    const int64_t rows = slot_of[i] < 0 ? 0 : targets[i].w->shape.front();
    first_task[i + 1] = first_task[i] + (rows + rows_per_task - 1) / rows_per_task;
  }
  pool.ParallelTasks(static_cast<size_t>(first_task[n_targets]), [&](size_t task, int) {
    size_t i = 0;
    while (static_cast<int64_t>(task) >= first_task[i + 1]) ++i;
    const TensorView& w = *targets[i].w;
    const int64_t n_rows = w.shape.front();
    const int64_t begin = (static_cast<int64_t>(task) - first_task[i]) * rows_per_task;
    DotRows(w, begin, std::min(n_rows, begin + rows_per_task), prepared[slot_of[i]], targets[i].y,
            n_rows);
  });
  for (size_t i = 0; i < n_targets; ++i)
    if (slot_of[i] < 0) MatMulBatch(pool, x, n_tokens, targets + i, 1);
}

void MatMul(ThreadPool& pool, const float* x, int64_t n_tokens, const TensorView& w, float* y) {
  const MatMulTarget target{&w, y};
  MatMulBatch(pool, x, n_tokens, &target, 1);
}

}  // namespace moetier::kernels

#if !defined(MOETIER_X86_KERNELS)
// Builds without the x86 translation units (another architecture): only the scalar kernels.
namespace moetier::kernels::isa {
const Kernels* Avx2Kernels() {
  return nullptr;
}
const Kernels* AvxVnniKernels() {
  return nullptr;
}
const Kernels* Avx512Kernels() {
  return nullptr;
}
const Kernels* Avx512VnniKernels() {
  return nullptr;
}
const Kernels* Avx512Bf16Kernels() {
  return nullptr;
}
const Kernels* AmxKernels() {
  return nullptr;
}
void Avx2ExpandBf16cRows(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k,
                         uint16_t* out, int64_t,
                         uintptr_t) {  // never called: KernelDType needs kAvx2
  for (int64_t r = 0; r < n_rows; ++r) UnpackRowBf16c(w + r * row_bytes, k, out + r * k);
}
void Avx2Bf16cRowsToF32(const uint8_t* w, int64_t row_bytes, int64_t n_rows, int64_t k, float* out,
                        int64_t stride, int64_t,
                        uintptr_t) {  // never called: IsaForWeights needs kAvx2
  for (int64_t r = 0; r < n_rows; ++r) Bf16cRowToF32(w + r * row_bytes, k, out + r * stride);
}
}  // namespace moetier::kernels::isa
#endif
