// Device time of a sampled step's last kernels: the logits' top-k candidates (LaunchTopKRows,
// which a sampled step on the GPU runs unless every row is drawn) and the device draw
// (LaunchDrawRows, with its non-finite scan), on rows of
// `--vocab` logits drawn from N(0, sigma^2), per row count and sampler. Prints one JSON line.
//
//   draw_bench [--vocab 151936] [--rows 1,16] [--sigma 0.5,3] [--reps 50]
//
// Samplers: "temperature" (1.0 alone, the OpenAI API's default), "top_p" (0.95 at temperature
// 0.6), "min_p" (0.05 at temperature 1.0). A small sigma gives flat rows (top-p keeps most of
// the vocabulary, as a model of random weights does); a large one peaked rows. Each figure is
// the median of --reps replays of a CUDA graph of the launches (as a decode step records them),
// timed by CUDA events after one warm-up, in microseconds.
// Exits 1 without a CUDA device or when a launch fails.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_support.h"
#include "core/logit_candidate.h"
#include "core/status.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/draw.h"
#include "kernels/cuda/top_k.h"

using namespace moetier;
using Json = nlohmann::ordered_json;

namespace {

struct Options {
  int64_t vocab = 151936;
  std::vector<int64_t> rows = {1, 16};
  std::vector<double> sigma = {0.5, 3.0};
  std::vector<int> slices = {0};  // blocks a row of the draw (0: its own choice)
  int reps = 50;
};

struct Sampler {
  const char* name;
  float temperature, top_p, min_p;
};
constexpr Sampler kSamplers[] = {
    {"temperature", 1.0f, 1.0f, 0.0f}, {"top_p", 0.6f, 0.95f, 0.0f}, {"min_p", 1.0f, 1.0f, 0.05f}};

constexpr const char* kUsage =
    "usage: draw_bench [--vocab N] [--rows 1,16] [--sigma 0.5,3] [--slices 0] [--reps R]\n"
    "  device time (us) of the logits' top-k and of the device draw per row count, logit spread,\n"
    "  sampler and slices a row (0: the draw's choice). Needs a CUDA device; prints one JSON\n"
    "  line. See the top of draw_bench.cpp.\n";

bool Parse(int argc, char** argv, Options& o) {
  using bench::ParseList;
  const bool known =
      bench::ParseFlagPairs("draw_bench", argc, argv, [&](const std::string& a, const char* v) {
        if (a == "--vocab") {
          o.vocab = std::atoll(v);
        } else if (a == "--rows") {
          o.rows = ParseList<int64_t>(v);
        } else if (a == "--sigma") {
          o.sigma = ParseList<double>(v);
        } else if (a == "--slices") {
          o.slices = ParseList<int>(v);
        } else if (a == "--reps") {
          o.reps = std::atoi(v);
        } else {
          return false;
        }
        return true;
      });
  if (!known) return false;
  const bool rows_ok = !o.rows.empty() && *std::min_element(o.rows.begin(), o.rows.end()) > 0;
  const bool slices_ok =
      !o.slices.empty() && *std::min_element(o.slices.begin(), o.slices.end()) >= 0;
  if (o.vocab <= 0 || o.vocab > kMaxDrawVocab || !rows_ok || o.sigma.empty() || o.reps <= 0 ||
      !slices_ok) {
    std::fprintf(stderr, "draw_bench: --vocab in [1, %lld], --rows and --reps > 0, --slices >= 0\n",
                 static_cast<long long>(kMaxDrawVocab));
    return false;
  }
  return true;
}

bool Ok(cudaError_t e, const char* what) {
  return bench::CudaOk("draw_bench", e, what);
}

// The median device time of `reps` replays of a CUDA graph of launch's kernels (as a decode step
// records them: no host gaps between them), after one warm-up, in microseconds; -1 when a launch
// failed.
template <typename F>
double MedianMicros(int reps, cudaStream_t stream, F launch) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (!Ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture")) return -1;
  launch();
  if (!Ok(cudaStreamEndCapture(stream, &graph), "capture") ||
      !Ok(cudaGraphInstantiate(&exec, graph, 0), "instantiating the graph"))
    return -1;
  cudaEvent_t start, stop;
  if (!Ok(cudaEventCreate(&start), "event") || !Ok(cudaEventCreate(&stop), "event")) return -1;
  cudaGraphLaunch(exec, stream);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    if (!Ok(cudaEventSynchronize(stop), "a timed launch")) return -1;
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    t.push_back(1000.0 * ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::nth_element(t.begin(), t.begin() + static_cast<ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, o)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "draw_bench: no CUDA device\n");
    return 1;
  }
  cudaStream_t stream;
  if (!Ok(cudaStreamCreate(&stream), "stream")) return 1;
  const int64_t max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  const auto n = static_cast<size_t>(max_rows * o.vocab);
  auto x = cuda::DeviceBuffer<float>::Create(n, "logits");
  auto scratch = cuda::DeviceBuffer<char>::Create(cuda::TopKScratchBytes(max_rows), "scratch");
  auto cands = cuda::DeviceBuffer<LogitCandidate>::Create(
      static_cast<size_t>(max_rows) * kMaxLogitCandidates, "candidates");
  auto counts = cuda::DeviceBuffer<int32_t>::Create(static_cast<size_t>(max_rows), "counts");
  auto draws = cuda::DeviceBuffer<RowDraw>::Create(static_cast<size_t>(max_rows), "draws");
  auto draw_scratch =
      cuda::DeviceBuffer<uint8_t>::Create(cuda::DrawScratchBytes(max_rows), "draw scratch");
  auto first = cuda::DeviceBuffer<unsigned long long>::Create(1, "the non-finite scan");
  for (const Status& s : {x.status(), scratch.status(), cands.status(), counts.status(),
                          draws.status(), draw_scratch.status(), first.status()})
    if (!s.ok()) {
      std::fprintf(stderr, "draw_bench: %s\n", s.message().c_str());
      return 1;
    }
  std::mt19937 rng(12345);
  Json results = Json::array();
  for (double sigma : o.sigma) {
    std::normal_distribution<float> normal(0.0f, static_cast<float>(sigma));
    std::vector<float> host(n);
    for (float& v : host) v = normal(rng);
    if (!Ok(cudaMemcpy(x->data(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
            "copying logits"))
      return 1;
    for (int64_t rows : o.rows) {
      const double top_k = MedianMicros(o.reps, stream, [&] {
        cuda::LaunchTopKRows(x->data(), rows, o.vocab, kMaxCandidateTopK, scratch->data(),
                             cands->data(), counts->data(), nullptr, stream);
      });
      Json row = {{"sigma", sigma}, {"rows", rows}, {"top_k_us", top_k}};
      for (const Sampler& s : kSamplers) {
        std::vector<RowDraw> d(static_cast<size_t>(rows));
        std::uniform_real_distribution<double> uniform(0.0, 1.0);
        for (RowDraw& r : d) r = {uniform(rng), 1.0f / s.temperature, s.top_p, s.min_p};
        if (!Ok(cudaMemcpy(draws->data(), d.data(), d.size() * sizeof(RowDraw),
                           cudaMemcpyHostToDevice),
                "copying draws"))
          return 1;
        for (const int slices : o.slices) {
          const std::string name =
              std::string(s.name) + (slices > 0 ? "_s" + std::to_string(slices) : "") + "_us";
          row[name] = MedianMicros(o.reps, stream, [&] {
            cuda::LaunchDrawRows(x->data(), rows, o.vocab, draws->data(), cuda::DrawWorkOf(d),
                                 draw_scratch->data(), cands->data(), counts->data(), first->data(),
                                 stream, slices);
          });
        }
      }
      results.push_back(row);
    }
  }
  if (!Ok(cudaStreamSynchronize(stream), "the last launch")) return 1;
  Json out = {{"vocab", o.vocab}, {"reps", o.reps}, {"results", results}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
