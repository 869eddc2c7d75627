// What a dependency between two phases of a decode step costs on the GPU: as a kernel boundary
// in a CUDA graph (the way decode steps run now, with and without programmatic dependent launch)
// and as a grid-wide barrier inside one persistent kernel (the way a per-layer persistent kernel
// would run them). Prints one JSON line.
//
//   boundary_bench [--width 2048] [--phases 256] [--blocks 0,1,2] [--reps 20]
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
  int reps = 20;
};

constexpr const char* kUsage =
    "usage: boundary_bench [--width 2048] [--phases 256] [--blocks 0,1,2] [--reps 20]\n"
    "  microseconds a phase of a chain of dependent RMSNorm phases costs as kernels in a CUDA\n"
    "  graph (with and without PDL) and as grid barriers in one persistent kernel. --blocks:\n"
    "  grid sizes in SMs (0: one block). Needs a CUDA device; prints one JSON line. See the top\n"
    "  of boundary_bench.cu.\n";

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
  if (o.width <= 0 || o.width > (1 << 24) || o.phases <= 0 || o.reps <= 0 || !blocks_ok) {
    std::fprintf(stderr,
                 "boundary_bench: --width in [1, 2^24], --phases and --reps > 0, --blocks >= 0\n");
    return false;
  }
  return true;
}

bool Ok(cudaError_t e, const char* what) {
  return moetier::bench::CudaOk("boundary_bench", e, what);
}

// The host's reference of the chain, phase by phase in double.
std::vector<float> Reference(std::vector<float> row, int phases) {
  for (int p = 0; p < phases; ++p) {
    double ss = 0.0;
    for (float v : row) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(row.size()) + kEps);
    for (float& v : row) v = static_cast<float>(v * inv);
  }
  return row;
}

struct Bench {
  Options o;
  cudaStream_t stream = nullptr;
  float* rows = nullptr;  // [2, width]: the phases' ping-pong rows
  Barrier* bar = nullptr;
  std::vector<float> input;

  bool Reset() {
    return Ok(cudaMemcpyAsync(rows, input.data(), input.size() * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              "copying the row") &&
           Ok(cudaMemsetAsync(bar, 0, sizeof(Barrier), stream), "clearing the barrier");
  }

  // The last row the chain wrote.
  std::vector<float> Result() {
    std::vector<float> out(input.size());
    const float* last = rows + (o.phases % 2) * o.width;
    if (!Ok(cudaMemcpy(out.data(), last, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "reading the row"))
      out.clear();
    return out;
  }

  void LaunchPhase(int p, unsigned grid, bool pdl) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = pdl ? 1 : 0;
    const float* in = rows + (p % 2) * o.width;
    float* out = rows + ((p + 1) % 2) * o.width;
    cudaLaunchKernelEx(&config, PhaseKernel, in, out, o.width);
  }

  // The median of reps runs of `run` (each after a Reset), microseconds a phase; the last run's
  // row in `row`; -1 when something failed.
  template <typename F>
  double Time(F run, std::vector<float>& row) {
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
      if (i > 0) t.push_back(1000.0 * ms / o.phases);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    row = Result();
    if (row.empty()) return -1;
    std::nth_element(t.begin(), t.begin() + static_cast<ptrdiff_t>(t.size() / 2), t.end());
    return t[t.size() / 2];
  }

  double Graph(unsigned grid, bool pdl, std::vector<float>& row) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (!Ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture")) return -1;
    for (int p = 0; p < o.phases; ++p) LaunchPhase(p, grid, pdl);
    if (!Ok(cudaStreamEndCapture(stream, &graph), "capture") ||
        !Ok(cudaGraphInstantiate(&exec, graph, 0), "instantiating the graph"))
      return -1;
    const double us =
        Time([&] { return Ok(cudaGraphLaunch(exec, stream), "launching the graph"); }, row);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return us;
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
        row);
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
    r["graph_us"] = b.Graph(grid, false, graph_row);
    r["graph_pdl_us"] = b.Graph(grid, true, pdl_row);
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
  const Json line = {{"device", prop.name},  {"sms", sms},       {"width", b.o.width},
                     {"phases", b.o.phases}, {"reps", b.o.reps}, {"results", results}};
  std::printf("%s\n", line.dump().c_str());
  return all_ok ? 0 : 1;
}
