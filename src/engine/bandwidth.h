// The machine's memory read bandwidth as this process sees it: every thread of the pool
// streams its share of a buffer several times larger than the caches. Benchmarks state their
// achieved GB/s as a share of this figure, measured in the same run.
#pragma once

#include <cstddef>

#include "core/status.h"
#include "core/thread_pool.h"

namespace moetier {

// Bytes read per measurement: far past any last-level cache (hundreds of MB at most today).
inline constexpr size_t kBandwidthBufferBytes = size_t{2} << 30;

// GB/s (1e9 bytes/s) over a buffer of `bytes`: the faster of two medians of `repeats` reads,
// one reading with software prefetch as the kernels do, one without. A buffer that cannot be
// mapped is an error (never a figure of 0).
Expected<double> MeasureReadBandwidthGbps(ThreadPool& pool, size_t bytes = kBandwidthBufferBytes,
                                          int repeats = 5);

}  // namespace moetier
