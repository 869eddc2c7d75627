// A streaming read of a buffer, as the weight kernels stream theirs: the widest vectors of the
// active level (ActiveCpuIsa), four vectors a step, optionally prefetching kStreamPrefetchBytes
// ahead. The loads feed a sum of the buffer's 64-bit words, so none can be skipped. The
// machine's read-bandwidth figure (engine/bandwidth.h) and kernel_bench's reference read are
// measured with it, so a kernel is held to a read of its own instruction set: a plain C++ loop
// built for baseline x86-64 read ~10 % slower than the AVX2 kernels streamed on the dev VM.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace moetier::kernels {

// As far ahead as the quantized kernels prefetch their stream (matmul_avx2_impl.h).
inline constexpr size_t kStreamPrefetchBytes = 2048;

// The sum (mod 2^64) of the n / 8 little-endian 64-bit words at `p` and of its n % 8 trailing
// bytes, read with `isa`'s loop (kScalar: portable C++; levels this build or CPU lacks fall back
// to the best one below them that runs). Any alignment.
uint64_t StreamReadSum(CpuIsa isa, const uint8_t* p, size_t n, bool prefetch);

// The same with the active level's loop.
uint64_t StreamReadSum(const uint8_t* p, size_t n, bool prefetch);

}  // namespace moetier::kernels
