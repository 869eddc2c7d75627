// What a dependency between two phases of a decode step costs on the GPU: as a kernel boundary
// in a CUDA graph (the way decode steps run now, with and without programmatic dependent launch)
// and as a grid-wide barrier inside one persistent kernel (the way a per-layer persistent kernel
// would run them). Prints one JSON line.
//
//   boundary_bench [--width 2048] [--phases 256] [--blocks 0,1,2] [--pairs 64] [--reps 20]
//
// Each phase is the smallest piece of real decode work: every block reads the whole row that
// the phase before wrote (--width floats), takes its RMS, and writes its slice of the next row
// normalized (an RMSNorm spread over the grid, as a norm feeding a matrix product is). A chain
// runs --phases phases; the figure is its median time over --reps runs divided by the phases, in
// microseconds. --blocks lists grid sizes in SMs (0: one block; 1: one block an SM; 2: two).
//
// Variants: `graph` (a kernel a phase, captured as a CUDA graph), `graph_pdl` (the same, each
// launch allowed to start while the one before drains: launch.cuh's PDL), `persistent` (one
// cooperative launch, a hand-written barrier between phases: an arrival counter and a
// generation flag in global memory) and `persistent_cg` (the same with cooperative groups'
// grid.sync()). Every variant's last row is checked against a host reference (relative
// tolerance 1e-5) and against the others (bit for bit: the same sums in the same order).
//
// Then (--pairs, when --width is a multiple of 256) what a norm costs in front of a matrix
// product: `norm_then_product` runs an RMSNorm kernel (one block) and a product kernel (a warp a
// row of a --width x --width bf16 matrix, its weights asked of L2 before it waits), as decode
// steps do now; `norm_in_product` has every product block take the norm itself instead, one
// dependency fewer. Both as PDL graphs, µs a (norm, product) pair, checked bit for bit against
// each other and against a host reference (relative tolerance 1e-4).
// Exits 1 without a CUDA device, when a launch fails or when a check fails.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_support.h"
#include "kernels/cuda/launch.cuh"

namespace {

using Json = nlohmann::ordered_json;
constexpr int kThreads = 256;
constexpr float kEps = 1e-6f;

struct Options {
  int width = 2048;
  int phases = 256;
  std::vector<int> blocks = {0, 1, 2};
  int pairs = 64;
  int reps = 20;
};

constexpr const char* kUsage =
    "usage: boundary_bench [--width 2048] [--phases 256] [--blocks 0,1,2] [--pairs 64] [--reps "
    "20]\n"
    "  microseconds a phase of a chain of dependent RMSNorm phases costs as kernels in a CUDA\n"
    "  graph (with and without PDL) and as grid barriers in one persistent kernel (--blocks:\n"
    "  grid sizes in SMs, 0: one block); then a norm before a matrix product as a kernel of its\n"
    "  own and inside the product (--pairs, 0: not). Needs a CUDA device; prints one JSON line.\n"
    "  See the top of boundary_bench.cu.\n";

// ---- the phase -------------------------------------------------------------------------------

// The block's sum of squares of in[0, width), the same order in every block and variant: each
// thread strides over the row, then a fixed tree over the threads.
__device__ float BlockSumSquares(const float* in, int width) {
  __shared__ float partial[kThreads];
  float s = 0.0f;
  for (int i = threadIdx.x; i < width; i += kThreads) s = fmaf(in[i], in[i], s);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();  // partial is free for the next phase
  return total;
}

// One phase: out = in / rms(in), block b writing its slice of out.
__device__ void Phase(const float* in, float* out, int width) {
  const float inv = rsqrtf(BlockSumSquares(in, width) / static_cast<float>(width) + kEps);
  const int slice = (width + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  const int begin = static_cast<int>(blockIdx.x) * slice;
  const int end = min(width, begin + slice);
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads) out[i] = in[i] * inv;
}

__global__ void __launch_bounds__(kThreads) PhaseKernel(const float* in, float* out, int width) {
  moetier::cuda::PdlWait();
  Phase(in, out, width);
}

// The grid barrier: the last block to arrive resets the counter and advances the generation;
// the others wait for the generation to move. Acquire/release at the GPU scope order the
// phases' writes and reads.
struct Barrier {
  unsigned int count;
  unsigned int generation;
};

__device__ unsigned int LoadAcquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ void StoreRelease(unsigned int* p, unsigned int v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ void GridBarrier(Barrier* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int gen = LoadAcquire(&bar->generation);
    __threadfence();  // this block's writes before its arrival
    if (atomicAdd(&bar->count, 1u) == gridDim.x - 1) {
      bar->count = 0;
      StoreRelease(&bar->generation, gen + 1);
    } else {
      while (LoadAcquire(&bar->generation) == gen) {
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    PersistentKernel(float* rows, int width, int phases, Barrier* bar) {
  for (int p = 0; p < phases; ++p) {
    Phase(rows + (p % 2) * width, rows + ((p + 1) % 2) * width, width);
    GridBarrier(bar);
  }
}

__global__ void __launch_bounds__(kThreads) PersistentCgKernel(float* rows, int width, int phases) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (int p = 0; p < phases; ++p) {
    Phase(rows + (p % 2) * width, rows + ((p + 1) % 2) * width, width);
    grid.sync();
  }
}

// ---- a norm before a matrix product ------------------------------------------------------------

constexpr int kWarps = kThreads / 32;  // matrix rows a product block computes, a warp each

// Row `row` of the bf16 matrix w [width, width] (bit patterns) times x (shared memory), summed
// over the warp: each lane takes 8 columns of every 256.
__device__ float WarpRowDot(const uint16_t* w, int row, const float* x, int width) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint16_t* r = w + static_cast<int64_t>(row) * width;
  float acc = 0.0f;
  for (int c = lane * 8; c < width; c += 256) {
    const uint4 v = *reinterpret_cast<const uint4*>(r + c);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc = fmaf(__uint_as_float(words[j] << 16), x[c + 2 * j], acc);
      acc = fmaf(__uint_as_float(words[j] & 0xffff0000u), x[c + 2 * j + 1], acc);
    }
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

// Asks L2 for the block's matrix rows (they do not depend on the kernel before), then waits.
__device__ void PrefetchRowsThenWait(const uint16_t* w, int width) {
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kWarps;
  moetier::cuda::PrefetchL2(w + row0 * width, int64_t{kWarps} * width * 2,
                            static_cast<int>(threadIdx.x), kThreads);
  moetier::cuda::PdlWait();
}

// out[row] for the block's rows, x in shared memory.
__device__ void ProductRows(const uint16_t* w, const float* x, float* out, int width) {
  const int row = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  const float dot = WarpRowDot(w, row, x, width);
  if (threadIdx.x % 32 == 0) out[row] = dot;
}

// One block: normed = in / rms(in).
__global__ void __launch_bounds__(kThreads)
    NormRowKernel(const float* in, float* normed, int width) {
  moetier::cuda::PdlWait();
  const float inv = rsqrtf(BlockSumSquares(in, width) / static_cast<float>(width) + kEps);
  for (int i = threadIdx.x; i < width; i += kThreads) normed[i] = in[i] * inv;
}

// out = w x, x read as the norm kernel wrote it.
__global__ void __launch_bounds__(kThreads)
    ProductKernel(const float* x, const uint16_t* w, float* out, int width) {
  extern __shared__ float xs[];
  PrefetchRowsThenWait(w, width);
  for (int i = threadIdx.x; i < width; i += kThreads) xs[i] = x[i];
  __syncthreads();
  ProductRows(w, xs, out, width);
}

// out = w (in / rms(in)), every block taking the norm itself: the same bits as the two kernels.
__global__ void __launch_bounds__(kThreads)
    NormProductKernel(const float* in, const uint16_t* w, float* out, int width) {
  extern __shared__ float xs[];
  PrefetchRowsThenWait(w, width);
  const float inv = rsqrtf(BlockSumSquares(in, width) / static_cast<float>(width) + kEps);
  for (int i = threadIdx.x; i < width; i += kThreads) xs[i] = in[i] * inv;
  __syncthreads();
  ProductRows(w, xs, out, width);
}

// ---- the host side ---------------------------------------------------------------------------

bool Parse(int argc, char** argv, Options& o) {
  const bool known = moetier::bench::ParseFlagPairs(
      "boundary_bench", argc, argv, [&](const std::string& a, const char* v) {
        if (a == "--width") {
          o.width = std::atoi(v);
        } else if (a == "--phases") {
          o.phases = std::atoi(v);
        } else if (a == "--blocks") {
          o.blocks = moetier::bench::ParseList<int>(v);
        } else if (a == "--pairs") {
          o.pairs = std::atoi(v);
        } else if (a == "--reps") {
          o.reps = std::atoi(v);
        } else {
          return false;
        }
        return true;
      });
  if (!known) return false;
  const bool blocks_ok =
      !o.blocks.empty() && *std::min_element(o.blocks.begin(), o.blocks.end()) >= 0;
  if (o.width <= 0 || o.width > (1 << 14) || o.phases <= 0 || o.reps <= 0 || o.pairs < 0 ||
      !blocks_ok) {
    std::fprintf(stderr,
                 "boundary_bench: --width in [1, 16384], --phases and --reps > 0, --blocks and "
                 "--pairs >= 0\n");
    return false;
  }
  return true;
}

bool Ok(cudaError_t e, const char* what) {
  return moetier::bench::CudaOk("boundary_bench", e, what);
}

// row / rms(row), in double.
std::vector<double> Normed(const std::vector<double>& row) {
  double ss = 0.0;
  for (double v : row) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(row.size()) + kEps);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] * inv;
  return out;
}

// The host's reference of the chain of norms, in double.
std::vector<float> Reference(const std::vector<float>& input, int phases) {
  std::vector<double> row(input.begin(), input.end());
  for (int p = 0; p < phases; ++p) row = Normed(row);
  return {row.begin(), row.end()};
}

float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The host's reference of `pairs` (norm, product) pairs with the bf16 matrix w, in double.
std::vector<float> PairsReference(const std::vector<float>& input, const std::vector<uint16_t>& w,
                                  int pairs) {
  const size_t n = input.size();
  std::vector<double> row(input.begin(), input.end());
  for (int p = 0; p < pairs; ++p) {
    const std::vector<double> x = Normed(row);
    for (size_t r = 0; r < n; ++r) {
      double dot = 0.0;
      for (size_t c = 0; c < n; ++c) dot += Bf16BitsToFloat(w[r * n + c]) * x[c];
      row[r] = dot;
    }
  }
  return {row.begin(), row.end()};
}

struct Bench {
  Options o;
  cudaStream_t stream = nullptr;
  float* rows = nullptr;       // [2, width]: the phases' ping-pong rows
  float* normed = nullptr;     // [width]: the norm kernel's output before a product
  uint16_t* matrix = nullptr;  // [width, width] bf16
  Barrier* bar = nullptr;
  std::vector<float> input;

  bool Reset() {
    return Ok(cudaMemcpyAsync(rows, input.data(), input.size() * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              "copying the row") &&
           Ok(cudaMemsetAsync(bar, 0, sizeof(Barrier), stream), "clearing the barrier");
  }

  // The row the last of `count` ping-pong steps wrote.
  std::vector<float> Result(int count) {
    std::vector<float> out(input.size());
    const float* last = rows + (count % 2) * o.width;
    if (!Ok(cudaMemcpy(out.data(), last, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "reading the row"))
      out.clear();
    return out;
  }

  // kernel<<<grid, kThreads, smem, stream>>>(args...), with PDL when asked.
  template <typename... Params, typename... Args>
  void Launch(void (*kernel)(Params...), unsigned grid, size_t smem, bool pdl, Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelEx(&config, kernel, args...);
  }

  const float* In(int p) const { return rows + (p % 2) * o.width; }
  float* Out(int p) const { return rows + ((p + 1) % 2) * o.width; }

  void LaunchPhase(int p, unsigned grid, bool pdl) {
    Launch(PhaseKernel, grid, 0, pdl, In(p), Out(p), o.width);
  }

  // Pair p: the norm, then the product; or the product taking the norm itself.
  void LaunchPair(int p, bool fused) {
    const auto grid = static_cast<unsigned>(o.width / kWarps);
    const size_t smem = sizeof(float) * static_cast<size_t>(o.width);
    const uint16_t* w = matrix;
    if (fused) {
      Launch(NormProductKernel, grid, smem, true, In(p), w, Out(p), o.width);
    } else {
      Launch(NormRowKernel, 1, 0, true, In(p), normed, o.width);
      Launch(ProductKernel, grid, smem, true, static_cast<const float*>(normed), w, Out(p),
             o.width);
    }
  }

  // The median of reps runs of `run` (each after a Reset), microseconds a step of `count`; the
  // last run's row in `row`; -1 when something failed.
  template <typename F>
  double Time(F run, int count, std::vector<float>& row) {
    cudaEvent_t start, stop;
    if (!Ok(cudaEventCreate(&start), "event") || !Ok(cudaEventCreate(&stop), "event")) return -1;
    std::vector<double> t;
    for (int i = 0; i <= o.reps; ++i) {  // run 0 warms up
      if (!Reset()) return -1;
      cudaEventRecord(start, stream);
      if (!run()) return -1;
      cudaEventRecord(stop, stream);
      if (!Ok(cudaEventSynchronize(stop), "a timed run")) return -1;
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      if (i > 0) t.push_back(1000.0 * ms / count);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    row = Result(count);
    if (row.empty()) return -1;
    std::nth_element(t.begin(), t.begin() + static_cast<ptrdiff_t>(t.size() / 2), t.end());
    return t[t.size() / 2];
  }

  // Times a CUDA graph of `count` steps, step p recorded by launch(p).
  template <typename F>
  double Graph(int count, F launch, std::vector<float>& row) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (!Ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture")) return -1;
    for (int p = 0; p < count; ++p) launch(p);
    if (!Ok(cudaStreamEndCapture(stream, &graph), "capture") ||
        !Ok(cudaGraphInstantiate(&exec, graph, 0), "instantiating the graph"))
      return -1;
    const double us =
        Time([&] { return Ok(cudaGraphLaunch(exec, stream), "launching the graph"); }, count, row);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return us;
  }

  double Phases(unsigned grid, bool pdl, std::vector<float>& row) {
    return Graph(
        o.phases, [&](int p) { LaunchPhase(p, grid, pdl); }, row);
  }

  double Pairs(bool fused, std::vector<float>& row) {
    return Graph(
        o.pairs, [&](int p) { LaunchPair(p, fused); }, row);
  }

  double Persistent(unsigned grid, bool cg, std::vector<float>& row) {
    int width = o.width, phases = o.phases;
    void* own_args[] = {&rows, &width, &phases, &bar};
    void* cg_args[] = {&rows, &width, &phases};
    return Time(
        [&] {
          const void* kernel = cg ? reinterpret_cast<const void*>(PersistentCgKernel)
                                  : reinterpret_cast<const void*>(PersistentKernel);
          return Ok(cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(kThreads),
                                                cg ? cg_args : own_args, 0, stream),
                    "the cooperative launch");
        },
        o.phases, row);
  }
};

// The largest relative difference of got from want, over want's largest magnitude.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double most = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    most = std::max(most, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return most / std::max(scale, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  Bench b;
  if (!Parse(argc, argv, b.o)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  int devices = 0, sms = 0, device = 0, coop = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "boundary_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  if (!Ok(cudaGetDevice(&device), "device") ||
      !Ok(cudaGetDeviceProperties(&prop, device), "device properties") ||
      !Ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count") ||
      !Ok(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device), "cooperative"))
    return 1;
  if (!Ok(cudaStreamCreate(&b.stream), "stream") ||
      !Ok(cudaMalloc(&b.rows, 2 * sizeof(float) * static_cast<size_t>(b.o.width)), "rows") ||
      !Ok(cudaMalloc(&b.bar, sizeof(Barrier)), "barrier"))
    return 1;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  b.input.resize(static_cast<size_t>(b.o.width));
  for (float& v : b.input) v = normal(rng);
  const std::vector<float> want = Reference(b.input, b.o.phases);

  bool all_ok = true;
  Json results = Json::array();
  for (int per_sm : b.o.blocks) {
    const auto grid = static_cast<unsigned>(per_sm == 0 ? 1 : per_sm * sms);
    int fit = 0;
    (void)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, PersistentKernel, kThreads, 0);
    const bool resident = coop != 0 && grid <= static_cast<unsigned>(fit * sms);
    std::vector<float> graph_row, pdl_row, own_row, cg_row;
    Json r = {{"blocks", grid}};
    r["graph_us"] = b.Phases(grid, false, graph_row);
    r["graph_pdl_us"] = b.Phases(grid, true, pdl_row);
    if (resident) {
      r["persistent_us"] = b.Persistent(grid, false, own_row);
      r["persistent_cg_us"] = b.Persistent(grid, true, cg_row);
    }
    for (const std::vector<float>* row : {&graph_row, &pdl_row, &own_row, &cg_row}) {
      if (row == &own_row && !resident) continue;
      if (row == &cg_row && !resident) continue;
      const bool ok = row->size() == want.size() && RelativeError(*row, want) <= 1e-5 &&
                      std::memcmp(row->data(), graph_row.data(), want.size() * sizeof(float)) == 0;
      if (!ok) {
        std::fprintf(stderr, "boundary_bench: a variant's row differs at %u blocks\n", grid);
        all_ok = false;
      }
    }
    r["max_rel_error"] = graph_row.size() == want.size() ? RelativeError(graph_row, want) : -1.0;
    results.push_back(r);
  }
  Json line = {{"device", prop.name},  {"sms", sms},       {"width", b.o.width},
               {"phases", b.o.phases}, {"reps", b.o.reps}, {"results", results}};
  if (b.o.pairs > 0 && b.o.width % 256 == 0) {
    const auto n = static_cast<size_t>(b.o.width);
    std::vector<uint16_t> w(n * n);
    std::normal_distribution<float> weight(0.0f, 1.0f / std::sqrt(static_cast<float>(n)));
    for (uint16_t& v : w) {
      const float f = weight(rng);
      uint32_t u;
      std::memcpy(&u, &f, sizeof(u));
      v = static_cast<uint16_t>(u >> 16);  // truncated: any bf16 will do
    }
    if (!Ok(cudaMalloc(&b.matrix, w.size() * sizeof(uint16_t)), "matrix") ||
        !Ok(cudaMalloc(&b.normed, n * sizeof(float)), "normed row") ||
        !Ok(cudaMemcpy(b.matrix, w.data(), w.size() * sizeof(uint16_t), cudaMemcpyHostToDevice),
            "copying the matrix"))
      return 1;
    std::vector<float> apart, fused;
    const double apart_us = b.Pairs(false, apart), fused_us = b.Pairs(true, fused);
    const std::vector<float> want_pairs = PairsReference(b.input, w, b.o.pairs);
    const double err = apart.size() == n ? RelativeError(apart, want_pairs) : -1.0;
    if (apart_us < 0 || fused_us < 0 || err < 0 || err > 1e-4 || fused.size() != n ||
        std::memcmp(apart.data(), fused.data(), n * sizeof(float)) != 0) {
      std::fprintf(stderr, "boundary_bench: the (norm, product) pairs differ\n");
      all_ok = false;
    }
    line["norm_product"] = {{"pairs", b.o.pairs},
                            {"norm_then_product_us", apart_us},
                            {"norm_in_product_us", fused_us},
                            {"max_rel_error", err}};
  }
  std::printf("%s\n", line.dump().c_str());
  return all_ok ? 0 : 1;
}
