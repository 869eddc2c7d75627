#include "engine/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/stream_read.h"

namespace moetier {

Expected<double> MeasureReadBandwidthGbps(ThreadPool& pool, size_t bytes, int repeats) {
  const size_t n = bytes / sizeof(uint64_t);
  if (n == 0) return Status::Error("the bandwidth buffer must hold at least 8 bytes");
  void* p = ::mmap(nullptr, n * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return Status::Error("cannot map " + std::to_string(bytes >> 20) +
                         " MiB to measure the read bandwidth: " + std::strerror(errno));
  auto* data = static_cast<uint64_t*>(p);
  // First touch from the pool, so pages sit where the threads that read them run.
  pool.ParallelFor(n, [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) data[i] = i;
  });
  std::vector<uint64_t> sinks(static_cast<size_t>(pool.size()), 0);
  // One read: one sequential stream per thread, read as the weight kernels read (the active
  // level's widest vectors), prefetched 2 KB ahead as they prefetch, or not at all. Which is
  // faster depends on the machine (dev VM, 2 threads, AVX2: 28 GB/s prefetched, 33.5 plain), so
  // both run, interleaved, and the faster median is the limit a kernel is held to.
  auto pass = [&](bool prefetch) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n, [&](size_t b, size_t e, int t) {
      sinks[static_cast<size_t>(t)] += kernels::StreamReadSum(
          reinterpret_cast<const uint8_t*>(data + b), (e - b) * sizeof(uint64_t), prefetch);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(n * sizeof(uint64_t)) / 1e9 / s;
  };
  std::vector<double> with, without;  // interleaved, so that both see the same machine
  for (int r = 0; r < repeats; ++r) {
    with.push_back(pass(true));
    without.push_back(pass(false));
  }
  ::munmap(p, n * sizeof(uint64_t));
  volatile uint64_t keep = sinks[0];  // the sums must be computed
  (void)keep;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return std::max(median(with), median(without));
}

}  // namespace moetier
