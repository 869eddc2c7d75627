#include "engine/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace moetier {

double MeasureReadBandwidthGbps(ThreadPool& pool, size_t bytes, int repeats) {
  const size_t n = bytes / sizeof(uint64_t);
  void* p = ::mmap(nullptr, n * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0.0;
  auto* data = static_cast<uint64_t*>(p);
  // First touch from the pool, so pages sit where the threads that read them run.
  pool.ParallelFor(n, [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i) data[i] = i;
  });
  std::vector<uint64_t> sinks(static_cast<size_t>(pool.size()), 0);
  std::vector<double> gbps;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n, [&](size_t b, size_t e, int t) {
      // Read as the weight kernels do: one sequential stream per thread, prefetched
      // kPrefetchWords ahead (hardware prefetch alone leaves 10-20 % on the table on some
      // machines), so that the figure is the limit they can reach, not a plain loop's.
      constexpr size_t kPrefetchWords = 2048 / sizeof(uint64_t);
      constexpr size_t kLineWords = 64 / sizeof(uint64_t);
      uint64_t acc = 0;
      size_t i = b;
      for (; i + kLineWords <= e; i += kLineWords) {
        __builtin_prefetch(data + i + kPrefetchWords);
#pragma omp simd reduction(+ : acc)
        for (size_t j = 0; j < kLineWords; ++j) acc += data[i + j];
      }
      for (; i < e; ++i) acc += data[i];
      sinks[static_cast<size_t>(t)] += acc;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(n * sizeof(uint64_t)) / 1e9 / s);
  }
  ::munmap(p, n * sizeof(uint64_t));
  std::sort(gbps.begin(), gbps.end());
  volatile uint64_t keep = sinks[0];  // the sums must be computed
  (void)keep;
  return gbps[gbps.size() / 2];
}

}  // namespace moetier
