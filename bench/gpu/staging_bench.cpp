// Host → device copy rates from memory CUDA cannot DMA from directly (malloc'd and touched, as a
// `locked` or `pageable` bank), against the pinned rate. Prints one JSON line on stdout.
//
//   staging_bench [--gib 1] [--reps 5] [--threads 1,4,8,16] [--chunk-mib 8,32] [--chunks 4]
//
// "pageable": one cudaMemcpyAsync straight from the malloc'd bytes (the driver stages them itself,
// and the host is blocked meanwhile: "host_blocked_s"). "ring": the same bytes through a
// StagingRing of --chunks chunks of each --chunk-mib, its memcpy spread over each --threads count
// (a ThreadPool of that size; 1: the calling thread alone); "host_s" is the time Copy held the
// host, "wait_pct" the share of it spent waiting for a chunk's DMA (near 0: the memcpy is the
// limit; large: the copy engine is). "pinned": one cudaMemcpyAsync from cudaMallocHost memory
// holding the same bytes, the copy engine's rate for reference ("pct_of_pinned").
//
// Each figure is the median of --reps timed runs (from the call to the stream's end) after one
// warm-up run, whose device bytes are read back and compared with the source ("verified").
// Exits 1 without a CUDA device, or when a copy fails or a comparison differs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/staging_ring.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

using namespace moetier;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kVerifyBlockBytes = 64 * kMiB;  // read back and compared a block at a time

struct Options {
  double gib = 1.0;
  int reps = 5;
  std::vector<int64_t> threads = {1, 4, 8, 16};
  std::vector<int64_t> chunk_mib = {8, 32};
  int chunks = cuda::StagingRing::kDefaultChunks;
};

constexpr const char* kUsage =
    "usage: staging_bench [--gib G] [--reps R] [--threads 1,4,8,16] [--chunk-mib 8,32]"
    " [--chunks N]\n"
    "  host -> device GB/s from malloc'd (pageable) memory: plain cudaMemcpyAsync, through the\n"
    "  pinned StagingRing per chunk size x thread count, and from pinned memory for reference.\n"
    "  Needs a CUDA device; prints one JSON line. See the top of staging_bench.cpp for each"
    " figure.\n";

// "1,4,8" → {1, 4, 8}; empty on anything but positive integers.
std::vector<int64_t> ParseCounts(const std::string& s) {
  std::vector<int64_t> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    const std::string item = s.substr(a, b - a);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) return {};
    const long long v = std::atoll(item.c_str());
    if (v <= 0) return {};
    out.push_back(v);
    a = b + 1;
  }
  return out;
}

// Parses argv into *opt; returns -1 to go on, else the exit code.
int ParseArgs(int argc, char** argv, Options* opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "staging_bench: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[++i];
    bool ok = true;
    if (a == "--gib") {
      opt->gib = std::atof(v.c_str());
      ok = opt->gib > 0;
    } else if (a == "--reps") {
      opt->reps = std::atoi(v.c_str());
      ok = opt->reps > 0;
    } else if (a == "--threads") {
      opt->threads = ParseCounts(v);
      ok = !opt->threads.empty();
    } else if (a == "--chunk-mib") {
      opt->chunk_mib = ParseCounts(v);
      ok = !opt->chunk_mib.empty();
    } else if (a == "--chunks") {
      opt->chunks = std::atoi(v.c_str());
      ok = opt->chunks >= 2;
    } else {
      std::fprintf(stderr, "staging_bench: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "staging_bench: bad value '%s' for %s\n%s", v.c_str(), a.c_str(),
                   kUsage);
      return 2;
    }
  }
  return -1;
}

template <typename Fn>
double Median(int reps, Fn&& fn) {
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) v.push_back(fn());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Gbps(size_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

// Whether the device bytes equal host[0, bytes).
Status Verify(const std::byte* device, const std::byte* host, size_t bytes) {
  std::vector<std::byte> block(std::min(bytes, kVerifyBlockBytes));
  for (size_t at = 0; at < bytes; at += block.size()) {
    const size_t n = std::min(block.size(), bytes - at);
    MT_CUDA_RETURN_IF_ERROR(cudaMemcpy(block.data(), device + at, n, cudaMemcpyDeviceToHost),
                            "reading the copied bytes back");
    if (std::memcmp(block.data(), host + at, n) != 0)
      return Status::Error("the device bytes differ from the source in [" + std::to_string(at) +
                           ", " + std::to_string(at + n) + ")");
  }
  return OkStatus();
}

struct Env {
  size_t bytes;
  const std::byte* src;  // malloc'd, touched
  std::byte* dst;        // device
  cudaStream_t stream;
  int reps;
};

// One cudaMemcpyAsync from `src` (pageable or pinned), median GB/s and host-blocked seconds.
Expected<Json> MeasureDirect(const Env& env, const std::byte* src) {
  MT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(env.dst, 0, env.bytes, env.stream), "clearing");
  double blocked_s = 0;
  auto run = [&]() -> Status {
    const auto t0 = Clock::now();
    MT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(env.dst, src, env.bytes, cudaMemcpyHostToDevice, env.stream),
        "cudaMemcpyAsync");
    blocked_s = Seconds(t0, Clock::now());
    return cuda::CudaStatus(cudaStreamSynchronize(env.stream), "cudaStreamSynchronize");
  };
  MT_RETURN_IF_ERROR(run());
  MT_RETURN_IF_ERROR(Verify(env.dst, env.src, env.bytes));
  Status failed;
  std::vector<double> blocked;
  const double s = Median(env.reps, [&] {
    const auto t0 = Clock::now();
    if (Status st = run(); !st.ok()) failed = st;
    blocked.push_back(blocked_s);
    return Seconds(t0, Clock::now());
  });
  MT_RETURN_IF_ERROR(failed);
  std::sort(blocked.begin(), blocked.end());
  return Json{{"gbps", Gbps(env.bytes, s)},
              {"host_blocked_s", blocked[blocked.size() / 2]},
              {"verified", true}};
}

// The whole source through `ring` with `pool`, median GB/s, host seconds and waiting share.
Expected<Json> MeasureRing(const Env& env, cuda::StagingRing& ring, ThreadPool* pool) {
  MT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(env.dst, 0, env.bytes, env.stream), "clearing");
  const cuda::StagingRing::Range range{env.src, env.dst, env.bytes};
  double host_s = 0, wait_s = 0;
  auto run = [&]() -> Status {
    const double wait0 = ring.wait_seconds();
    const auto t0 = Clock::now();
    MT_RETURN_IF_ERROR(ring.Copy({&range, 1}, env.stream, pool));
    host_s = Seconds(t0, Clock::now());
    wait_s = ring.wait_seconds() - wait0;
    return cuda::CudaStatus(cudaStreamSynchronize(env.stream), "cudaStreamSynchronize");
  };
  MT_RETURN_IF_ERROR(run());
  MT_RETURN_IF_ERROR(Verify(env.dst, env.src, env.bytes));
  Status failed;
  std::vector<double> hosts, waits;
  const double s = Median(env.reps, [&] {
    const auto t0 = Clock::now();
    if (Status st = run(); !st.ok()) failed = st;
    hosts.push_back(host_s);
    waits.push_back(host_s > 0 ? 100.0 * wait_s / host_s : 0.0);
    return Seconds(t0, Clock::now());
  });
  MT_RETURN_IF_ERROR(failed);
  std::sort(hosts.begin(), hosts.end());
  std::sort(waits.begin(), waits.end());
  return Json{{"gbps", Gbps(env.bytes, s)},
              {"host_s", hosts[hosts.size() / 2]},
              {"wait_pct", waits[waits.size() / 2]},
              {"verified", true}};
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "staging_bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (const int rc = ParseArgs(argc, argv, &opt); rc >= 0) return rc;
  if (!cuda::DeviceAvailable())
    return Fail("no CUDA device on this machine; run it where a GPU is present");

  const size_t bytes = static_cast<size_t>(opt.gib * static_cast<double>(size_t{1} << 30));
  std::unique_ptr<std::byte, FreeDeleter> src(static_cast<std::byte*>(std::malloc(bytes)));
  if (src == nullptr) return Fail("cannot malloc " + std::to_string(bytes) + " bytes of source");
  for (size_t i = 0; i < bytes; i += 8) {  // touched: every page real, none of them the zero page
    const uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(src.get() + i, &x, std::min<size_t>(8, bytes - i));
  }
  auto dst = cuda::DeviceBuffer<std::byte>::Create(bytes, "the copy's destination");
  if (!dst.ok()) return Fail(dst.message());
  cudaStream_t stream = nullptr;
  if (Status s = cuda::CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                  "creating a stream");
      !s.ok())
    return Fail(s.message());
  const Env env{bytes, src.get(), dst->data(), stream, opt.reps};

  cudaDeviceProp prop{};
  int device = 0;
  (void)cudaGetDevice(&device);
  (void)cudaGetDeviceProperties(&prop, device);
  Json out;
  out["bench"] = "staging";
  out["device"] = prop.name;
  out["host_threads_available"] = ThreadPool::AvailableThreads();
  out["bytes"] = bytes;
  out["reps"] = opt.reps;

  Expected<Json> pageable = MeasureDirect(env, src.get());
  if (!pageable.ok()) return Fail("pageable copy: " + pageable.message());
  out["pageable"] = *pageable;

  double pinned_gbps = 0;
  void* pinned = nullptr;
  if (cudaMallocHost(&pinned, bytes) == cudaSuccess) {
    std::memcpy(pinned, src.get(), bytes);
    Expected<Json> p = MeasureDirect(env, static_cast<const std::byte*>(pinned));
    cudaFreeHost(pinned);
    if (!p.ok()) return Fail("pinned copy: " + p.message());
    pinned_gbps = (*p)["gbps"].get<double>();
    out["pinned"] = *p;
  } else {
    (void)cudaGetLastError();
    out["pinned"] = {{"error", "cudaMallocHost refused " + std::to_string(bytes) + " bytes"}};
  }

  Json rings = Json::array();
  for (const int64_t mib : opt.chunk_mib) {
    auto ring = cuda::StagingRing::Create(static_cast<size_t>(mib) * kMiB, opt.chunks);
    if (!ring.ok()) return Fail(ring.message());
    for (const int64_t t : opt.threads) {
      if (t > ThreadPool::MaxThreads()) continue;  // more than the pool may create here
      ThreadPool pool(static_cast<int>(t));
      Expected<Json> r = MeasureRing(env, **ring, &pool);
      if (!r.ok())
        return Fail("ring of " + std::to_string(mib) + " MiB chunks, " + std::to_string(t) +
                    " threads: " + r.message());
      Json row = {{"chunk_mib", mib},
                  {"chunks", opt.chunks},
                  {"threads", t},
                  {"oversubscribed", t > ThreadPool::AvailableThreads()}};
      row.update(*r);
      if (pinned_gbps > 0) row["pct_of_pinned"] = 100.0 * (*r)["gbps"].get<double>() / pinned_gbps;
      rings.push_back(row);
    }
  }
  out["ring"] = rings;
  cudaStreamDestroy(stream);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
