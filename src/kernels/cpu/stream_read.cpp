#include "kernels/cpu/stream_read.h"

#include <cstring>

#if defined(MOETIER_X86_KERNELS)
#include <immintrin.h>
#endif

namespace moetier::kernels {

namespace {

uint64_t SumTail(const uint8_t* p, size_t i, size_t n, uint64_t s) {
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    s += w;
  }
  for (; i < n; ++i) s += p[i];
  return s;
}

uint64_t ReadScalar(const uint8_t* p, size_t n, bool prefetch) {
  uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains, as the vector loops keep
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (prefetch && i % 64 == 0) __builtin_prefetch(p + i + kStreamPrefetchBytes);
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a += w[0];
    b += w[1];
    c += w[2];
    d += w[3];
  }
  return SumTail(p, i, n, a + b + c + d);
}

#if defined(MOETIER_X86_KERNELS)
// A step loads four vectors (two 64-byte lines with AVX2, four with AVX-512) into four chains
// and, when prefetching, prefetches each of its lines kStreamPrefetchBytes ahead. (kPrefetch is
// a template argument: a run-time test per step cost ~15 % of a plain loop.)
template <bool kPrefetch>
__attribute__((target("avx2"))) uint64_t ReadAvx2(const uint8_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    if constexpr (kPrefetch) {
      __builtin_prefetch(p + i + kStreamPrefetchBytes);
      __builtin_prefetch(p + i + 64 + kStreamPrefetchBytes);
    }
    a = _mm256_add_epi64(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t l[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return SumTail(p, i, n, l[0] + l[1] + l[2] + l[3]);
}

template <bool kPrefetch>
__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    if constexpr (kPrefetch)
      for (size_t j = 0; j < 256; j += 64) __builtin_prefetch(p + i + j + kStreamPrefetchBytes);
    a = _mm512_add_epi64(a, _mm512_loadu_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(p + i + 192));
  }
  alignas(64) uint64_t l[8];
  _mm512_store_si512(l, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  uint64_t s = 0;
  for (uint64_t v : l) s += v;
  return SumTail(p, i, n, s);
}
#endif

bool IsAvx512Level(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Vnni || isa == CpuIsa::kAvx512Bf16 ||
         isa == CpuIsa::kAmx;
}

}  // namespace

uint64_t StreamReadSum(CpuIsa isa, const uint8_t* p, size_t n, bool prefetch) {
#if defined(MOETIER_X86_KERNELS)
  if (IsAvx512Level(isa) && CpuSupports(CpuIsa::kAvx512))
    return prefetch ? ReadAvx512<true>(p, n) : ReadAvx512<false>(p, n);
  if (isa != CpuIsa::kScalar && CpuSupports(CpuIsa::kAvx2))
    return prefetch ? ReadAvx2<true>(p, n) : ReadAvx2<false>(p, n);
#else
  (void)isa;
#endif
  return ReadScalar(p, n, prefetch);
}

uint64_t StreamReadSum(const uint8_t* p, size_t n, bool prefetch) {
  return StreamReadSum(ActiveCpuIsa(), p, n, prefetch);
}

}  // namespace moetier::kernels
