#include "kernels/cuda/bf16c_expand.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/launch.cuh"

namespace moetier::cuda {

namespace {

// The format's numbers (kernels/cpu/matmul_isa.h, "BF16C").
constexpr int kHeader = 64;        // table[16], then 12 exceptions of {uint16 index, uint16 bits}
constexpr int kExceptionsAt = 16;  // byte offset of the exception list
constexpr int kMaxExceptions = 12;
constexpr int kBlockWeights = 32;
constexpr int kBlockBytes = 48;   // lo[32] in slot order, then code[16] (two 4-bit codes a byte)
constexpr int kExpandJobs = 64;   // row runs a launch takes (its parameter block: 2 KB)
constexpr int kRowsPerBlock = 8;  // a warp a row

struct ExpandJobs {
  Bf16cRows j[kExpandJobs];
};

__host__ __device__ constexpr int64_t PackedRowBytes(int64_t k) {
  return kHeader + k / kBlockWeights * kBlockBytes;
}

// Weight j of a block sits in slot Bf16cSlot(j) (matmul_isa.h).
__device__ constexpr int Slot(int j) {
  const int a = j / 8, d = j % 8;
  return 16 * (d / 4) + 8 * (a / 2) + 2 * (d % 4) + a % 2;
}

__device__ __forceinline__ uint32_t ByteOf(const uint32_t (&w)[12], int i) {
  return (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
}

// The 32 bf16 of one 48-byte block (w: its 12 words), high bytes looked up in the row's table
// (t: its 4 words).
__device__ __forceinline__ void DecodeBlock(const uint32_t (&w)[12], const uint32_t (&t)[4],
                                            uint32_t (&out)[16]) {
#pragma unroll
  for (int j = 0; j < kBlockWeights; j += 2) {
    uint32_t pair = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = Slot(j + h);
      const uint32_t lo = ByteOf(w, s);
      const uint32_t code = s < 16 ? ByteOf(w, 32 + s) & 15u : ByteOf(w, 32 + s - 16) >> 4;
      const uint32_t hi =
          __byte_perm(code < 8 ? t[0] : t[2], code < 8 ? t[1] : t[3], code & 7u) & 0xFFu;
      pair |= ((hi << 8) | lo) << (16 * h);
    }
    out[j / 2] = pair;
  }
}

// One packed row of k weights to k bf16 at dst (a warp; lanes take blocks in turn).
__device__ void ExpandRow(const uint8_t* row, int64_t k, uint16_t* dst, int lane) {
  uint32_t t[4];
  {
    const uint4 v = *reinterpret_cast<const uint4*>(row);
    t[0] = v.x, t[1] = v.y, t[2] = v.z, t[3] = v.w;
  }
  for (int64_t b = lane; b < k / kBlockWeights; b += 32) {
    const uint4* src = reinterpret_cast<const uint4*>(row + kHeader + b * kBlockBytes);
    uint32_t w[12];
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const uint4 v = src[q];
      w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
    }
    uint32_t out[16];
    DecodeBlock(w, t, out);
    uint4* o = reinterpret_cast<uint4*>(dst + b * kBlockWeights);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      o[q] = make_uint4(out[4 * q], out[4 * q + 1], out[4 * q + 2], out[4 * q + 3]);
  }
  __syncwarp();  // the blocks' stores before the exceptions overwrite some of them
  if (lane == 0) {
    for (int e = 0; e < kMaxExceptions; ++e) {
      const uint8_t* x = row + kExceptionsAt + 4 * e;
      const int at = x[0] | (x[1] << 8);
      if (at < k) dst[at] = static_cast<uint16_t>(x[2] | (x[3] << 8));
    }
  }
}

// Grid: (row groups, jobs); a job's rows beyond its n_rows leave at once.
__global__ void ExpandKernel(ExpandJobs jobs) {
  PdlWait();
  const Bf16cRows job = jobs.j[blockIdx.y];
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= job.n_rows) return;
  ExpandRow(job.packed + r * PackedRowBytes(job.k), job.k,
            reinterpret_cast<uint16_t*>(job.out) + r * job.k, static_cast<int>(threadIdx.x % 32));
}

void LaunchJobs(const ExpandJobs& jobs, int n, cudaStream_t stream) {
  int64_t rows = 0;
  for (int i = 0; i < n; ++i) rows = std::max(rows, jobs.j[i].n_rows);
  if (rows == 0) return;
  const auto groups = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  Launch(ExpandKernel, dim3(groups, static_cast<unsigned>(n)), dim3(32 * kRowsPerBlock), 0, stream,
         jobs);
}

}  // namespace

void LaunchExpandBf16cRows(std::span<const Bf16cRows> rows, cudaStream_t stream) {
  for (size_t first = 0; first < rows.size(); first += kExpandJobs) {
    const size_t n = std::min<size_t>(kExpandJobs, rows.size() - first);
    ExpandJobs jobs{};
    std::copy_n(rows.begin() + static_cast<std::ptrdiff_t>(first), n, jobs.j);
    LaunchJobs(jobs, static_cast<int>(n), stream);
  }
}

void LaunchExpandBf16c(std::span<const Bf16cExpansion> experts, int64_t d_model, int64_t width,
                       cudaStream_t stream) {
  // Two runs an expert: gate and up (2 x width rows of d_model), then down (d_model of width).
  const int64_t gate_up_packed = 2 * width * PackedRowBytes(d_model);
  const int64_t gate_up_out = 2 * width * d_model * 2;
  ExpandJobs jobs{};
  int n = 0;
  for (const Bf16cExpansion& e : experts) {
    jobs.j[n++] = Bf16cRows{e.packed, e.slot, 2 * width, d_model};
    jobs.j[n++] = Bf16cRows{e.packed + gate_up_packed, e.slot + gate_up_out, d_model, width};
    if (n == kExpandJobs) {
      LaunchJobs(jobs, n, stream);
      n = 0;
    }
  }
  if (n > 0) LaunchJobs(jobs, n, stream);
}

}  // namespace moetier::cuda
