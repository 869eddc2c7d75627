// StreamReadSum: every level's loop (AVX-512, AVX2, portable), prefetching or not, returns the
// sum of the buffer's 64-bit words and trailing bytes, computed here word by word, on fresh
// random bytes of every length around the loops' step sizes and at every alignment mod 8.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/stream_read.h"

namespace moetier::kernels {
namespace {

uint64_t Reference(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    for (int b = 0; b < 8; ++b)
      w |= static_cast<uint64_t>(p[i + static_cast<size_t>(b)]) << (8 * b);
    s += w;
  }
  for (; i < n; ++i) s += p[i];
  return s;
}

TEST(StreamRead, EveryLevelSumsEveryLengthAndAlignment) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> buf(70000 + 8);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths = {0,   1,   7,   8,   9,   31,  32,   33,   63,        64,
                                 127, 128, 129, 255, 256, 257, 1000, 4096, 65536 + 13};
  for (int i = 0; i < 8; ++i) lengths.push_back(rng() % 70000);
  int levels = 0;
  for (CpuIsa isa : kAllCpuIsas) {
    if (!CpuSupports(isa)) continue;
    ++levels;
    for (size_t offset = 0; offset < 8; ++offset)
      for (size_t n : lengths)
        for (bool prefetch : {false, true})
          ASSERT_EQ(StreamReadSum(isa, buf.data() + offset, n, prefetch),
                    Reference(buf.data() + offset, n))
              << CpuIsaName(isa) << " offset " << offset << " n " << n << " prefetch " << prefetch;
  }
  EXPECT_GE(levels, 1);  // the portable loop always runs
  EXPECT_EQ(StreamReadSum(buf.data(), 1000, true), Reference(buf.data(), 1000));
}

// The sum wraps modulo 2^64 on every level alike.
TEST(StreamRead, SumsWrapAround) {
  std::vector<uint8_t> ones(4096 + 24, 0xFF);
  const uint64_t want = Reference(ones.data(), ones.size());
  for (CpuIsa isa : kAllCpuIsas) {
    if (!CpuSupports(isa)) continue;
    EXPECT_EQ(StreamReadSum(isa, ones.data(), ones.size(), false), want) << CpuIsaName(isa);
  }
}

}  // namespace
}  // namespace moetier::kernels
