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
  // One pass: one sequential stream per thread, four cache lines a step, prefetched 2 KB ahead
  // as the weight kernels prefetch, or not at all. Which is faster depends on the machine and
  // the loop (dev VM, 2 threads: this loop 33 GB/s prefetched and 25 plain, kernel_bench's AVX2
  // read 28 and 33.5), so both run, interleaved, and the faster median is the limit a kernel is
  // held to. (Two instantiations: a run-time flag inside the loop cost ~15 %.)
  auto pass = [&]<bool kPrefetch>() {
    const auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n, [&](size_t b, size_t e, int t) {
      constexpr size_t kPrefetchWords = 2048 / sizeof(uint64_t);
      constexpr size_t kLineWords = 64 / sizeof(uint64_t);
      constexpr size_t kStepWords = 4 * kLineWords;  // four lines a step: loads in flight
      uint64_t acc = 0;
      size_t i = b;
      for (; i + kStepWords <= e; i += kStepWords) {
        if constexpr (kPrefetch)
          for (size_t l = 0; l < kStepWords; l += kLineWords)
            __builtin_prefetch(data + i + l + kPrefetchWords);
#pragma omp simd reduction(+ : acc)
        for (size_t j = 0; j < kStepWords; ++j) acc += data[i + j];
      }
      for (; i < e; ++i) acc += data[i];
      sinks[static_cast<size_t>(t)] += acc;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(n * sizeof(uint64_t)) / 1e9 / s;
  };
  std::vector<double> with, without;  // interleaved, so that both see the same machine
  for (int r = 0; r < repeats; ++r) {
    with.push_back(pass.template operator()<true>());
    without.push_back(pass.template operator()<false>());
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
