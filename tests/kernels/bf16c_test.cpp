// BF16C (kernels/cpu/bf16c.h, layout in matmul_isa.h) on fresh random rows: the encoder is exact
// and matches the documented byte layout as this file reads it, independently of the decoders;
// every decoder gives the input bits back; damaged rows never make a decoder write out of bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_isa.h"

namespace moetier {
namespace {

using kernels::MaxBf16cExceptions;
using kernels::PackRowBf16c;
using kernels::UnpackRowBf16c;

// The layout as documented, restated here so that a change to the encoder or to matmul_isa.h that
// moves bytes around fails these tests instead of silently agreeing with itself.
constexpr int kHeader = 64;
constexpr int kBlockBytes = 48;
constexpr int kTableBytes = 16;
constexpr int kMaxExceptions = 12;
constexpr uint16_t kNone = 0xFFFF;

// Element j of a block lives in slot 16*(d/4) + 8*(a/2) + 2*(d%4) + a%2, a = j/8, d = j%8.
constexpr int Slot(int j) {
  const int a = j / 8, d = j % 8;
  return 16 * (d / 4) + 8 * (a / 2) + 2 * (d % 4) + a % 2;
}

uint16_t Load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Each test draws a new seed and names it in every failure, so a failure can be replayed.
struct Seeded {
  uint32_t seed = std::random_device{}();
  std::mt19937 rng{seed};
  std::string Trace() const { return "seed " + std::to_string(seed); }
};

size_t RowBytes(int64_t k) {
  return DTypeRowBytes(DType::kBF16C, k);
}

// The top-16 rule, computed here on its own: the 16 most frequent high bytes (ties to the
// smaller byte), and the elements left out of them.
struct Ranking {
  std::vector<uint8_t> table;  // up to 16 bytes that occur, most frequent first
  std::array<bool, 256> in_table{};
  int exceptions = 0;
};

Ranking Rank(const uint16_t* bits, int64_t k) {
  std::array<int64_t, 256> count{};
  for (int64_t i = 0; i < k; ++i) ++count[bits[i] >> 8];
  std::vector<int> present;
  for (int h = 0; h < 256; ++h)
    if (count[h] > 0) present.push_back(h);
  std::sort(present.begin(), present.end(),
            [&](int a, int b) { return count[a] != count[b] ? count[a] > count[b] : a < b; });
  Ranking r;
  for (size_t c = 0; c < present.size() && c < 16; ++c) {
    r.table.push_back(static_cast<uint8_t>(present[c]));
    r.in_table[present[c]] = true;
  }
  for (int64_t i = 0; i < k; ++i) r.exceptions += !r.in_table[bits[i] >> 8];
  return r;
}

// Checks a packed row byte by byte against the documented layout for input `bits`.
void ExpectLayout(const uint16_t* bits, int64_t k, const std::vector<uint8_t>& row) {
  ASSERT_EQ(row.size(), RowBytes(k));
  const Ranking want = Rank(bits, k);
  // Table: exactly the 16 most frequent high bytes, unused entries 0 (compared as multisets:
  // the order is the encoder's choice).
  std::vector<uint8_t> table(row.begin(), row.begin() + kTableBytes);
  std::vector<uint8_t> want_table = want.table;
  want_table.resize(kTableBytes, 0);
  std::vector<uint8_t> got_sorted = table;
  std::sort(got_sorted.begin(), got_sorted.end());
  std::sort(want_table.begin(), want_table.end());
  EXPECT_EQ(got_sorted, want_table) << "table is not the 16 most frequent high bytes";

  // Exceptions: every element whose high byte is not in the table, ascending, then 0xFFFF.
  std::vector<int64_t> want_at;
  for (int64_t i = 0; i < k; ++i)
    if (!want.in_table[bits[i] >> 8]) want_at.push_back(i);
  ASSERT_LE(want_at.size(), static_cast<size_t>(kMaxExceptions));
  for (int e = 0; e < kMaxExceptions; ++e) {
    const uint8_t* x = row.data() + kTableBytes + 4 * e;
    if (static_cast<size_t>(e) < want_at.size()) {
      EXPECT_EQ(Load16(x), want_at[e]) << "exception " << e;
      EXPECT_EQ(Load16(x + 2), bits[want_at[e]]) << "exception " << e;
    } else {
      EXPECT_EQ(Load16(x), kNone) << "unused exception slot " << e;
    }
  }

  // Blocks: element j of block b at slot Slot(j): its low byte, and a code naming its high byte
  // in the table; an exception's slot holds code 0 and low byte 0.
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* blk = row.data() + kHeader + b * kBlockBytes;
    for (int j = 0; j < 32; ++j) {
      const int64_t i = b * 32 + j;
      const int s = Slot(j);
      const int code = (blk[32 + s % 16] >> (s < 16 ? 0 : 4)) & 15;
      if (want.in_table[bits[i] >> 8]) {
        ASSERT_EQ(blk[s], bits[i] & 0xFF) << "element " << i;
        ASSERT_EQ(table[code], bits[i] >> 8) << "element " << i;
      } else {
        ASSERT_EQ(blk[s], 0) << "exception element " << i;
        ASSERT_EQ(code, 0) << "exception element " << i;
      }
    }
  }
}

// The decode this file reads from the documented layout: blocks, then the header's exceptions in
// list order (an index >= k names no element).
std::vector<uint16_t> ReferenceDecode(const uint8_t* row, int64_t k) {
  std::vector<uint16_t> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    const uint8_t* blk = row + kHeader + i / 32 * kBlockBytes;
    const int s = Slot(static_cast<int>(i % 32));
    const int code = (blk[32 + s % 16] >> (s < 16 ? 0 : 4)) & 15;
    out[i] = static_cast<uint16_t>(row[code] << 8 | blk[s]);
  }
  for (int e = 0; e < kMaxExceptions; ++e) {
    const uint8_t* x = row + kTableBytes + 4 * e;
    if (Load16(x) < k) out[Load16(x)] = Load16(x + 2);
  }
  return out;
}

// Packs `bits`, checks the exception count against the independent ranking, the layout and the
// exact round trip through UnpackRowBf16c and isa::Bf16cRowToF32. Returns the count.
int PackAndCheck(const std::vector<uint16_t>& bits, std::vector<uint8_t>* out = nullptr) {
  const int64_t k = static_cast<int64_t>(bits.size());
  std::vector<uint8_t> row(RowBytes(k), 0xA5);
  const int n = PackRowBf16c(bits.data(), k, row.data());
  const Ranking want = Rank(bits.data(), k);
  if (want.exceptions > kMaxExceptions) {
    EXPECT_EQ(n, -1) << "k " << k << ": " << want.exceptions << " exceptions must not pack";
    EXPECT_EQ(MaxBf16cExceptions(bits.data(), 1, k), -1) << "k " << k;
    return n;
  }
  EXPECT_EQ(n, want.exceptions) << "k " << k;
  EXPECT_EQ(MaxBf16cExceptions(bits.data(), 1, k), want.exceptions) << "k " << k;
  if (n < 0) return n;
  {
    SCOPED_TRACE("layout, k " + std::to_string(k));
    ExpectLayout(bits.data(), k, row);
  }
  std::vector<uint16_t> back(static_cast<size_t>(k), 0x1234);
  UnpackRowBf16c(row.data(), k, back.data());
  for (int64_t i = 0; i < k; ++i)
    if (back[i] != bits[i]) {
      ADD_FAILURE() << "k " << k << " element " << i << ": unpacked 0x" << std::hex << back[i]
                    << ", packed 0x" << bits[i];
      break;
    }
  std::vector<float> f(static_cast<size_t>(k) + 16, 7.0f);
  kernels::isa::Bf16cRowToF32(row.data(), k, f.data() + 8);
  for (int64_t i = 0; i < k; ++i)
    if (FloatBits(f[8 + i]) != FloatBits(Bf16ToF32(bits[i]))) {
      ADD_FAILURE() << "k " << k << " element " << i << ": Bf16cRowToF32 bits 0x" << std::hex
                    << FloatBits(f[8 + i]) << ", want 0x" << FloatBits(Bf16ToF32(bits[i]));
      break;
    }
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(f[g], 7.0f) << "Bf16cRowToF32 wrote before its output, k " << k;
    EXPECT_EQ(f[8 + k + g], 7.0f) << "Bf16cRowToF32 wrote past its output, k " << k;
  }
  if (out != nullptr) *out = std::move(row);
  return n;
}

// bf16 of a normal draw at `scale`; with `trimmed`, draws under scale/256 are redrawn, so a row's
// magnitudes span ~11 binades (the table covers 16 of each sign) and it always packs.
std::vector<uint16_t> NormalRow(int64_t k, float scale, bool trimmed, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> bits(static_cast<size_t>(k));
  for (auto& b : bits) {
    float z = dist(rng);
    while (trimmed && std::fabs(z) < 1.0f / 256) z = dist(rng);
    b = F32ToBf16(z * scale);
  }
  return bits;
}

// A row whose high bytes are exactly `highs` (each at least `min_each` times, the rest spread at
// random) with random low bytes, in random order.
std::vector<uint16_t> RowOfHighBytes(int64_t k, const std::vector<uint8_t>& highs, int min_each,
                                     std::mt19937& rng) {
  std::vector<uint16_t> bits;
  for (uint8_t h : highs)
    for (int c = 0; c < min_each; ++c)
      bits.push_back(static_cast<uint16_t>(h << 8 | (rng() & 0xFF)));
  while (static_cast<int64_t>(bits.size()) < k)
    bits.push_back(static_cast<uint16_t>(highs[rng() % highs.size()] << 8 | (rng() & 0xFF)));
  std::shuffle(bits.begin(), bits.end(), rng);
  return bits;
}

// 16 high bytes around `scale`'s (8 binade pairs of each sign), as a weight row's would be.
std::vector<uint8_t> SixteenHighBytes(float scale) {
  const int h = (F32ToBf16(scale) >> 8) & 0x7F;
  std::vector<uint8_t> highs;
  for (int d = -4; d < 4; ++d) {
    highs.push_back(static_cast<uint8_t>(h + d));
    highs.push_back(static_cast<uint8_t>(0x80 | (h + d)));
  }
  return highs;
}

constexpr int64_t kMaxK = kBf16cMaxRowElements;

TEST(Bf16c, SlotOrderIsAPermutationMatchingTheHeader) {
  std::array<int, 32> seen{};
  for (int j = 0; j < 32; ++j) {
    ASSERT_GE(Slot(j), 0);
    ASSERT_LT(Slot(j), 32);
    ++seen[Slot(j)];
    EXPECT_EQ(kernels::isa::Bf16cSlot(j), Slot(j)) << "element " << j;
  }
  for (int s = 0; s < 32; ++s) EXPECT_EQ(seen[s], 1) << "slot " << s;
  // The AVX2 reading the format is built for: slots 0..15 and 16..31 are the two 128-bit lanes,
  // and each group of 8 elements lands 4 in each lane.
  for (int a = 0; a < 4; ++a) {
    int low_lane = 0;
    for (int d = 0; d < 8; ++d) low_lane += Slot(8 * a + d) < 16;
    EXPECT_EQ(low_lane, 4) << "group " << a;
  }
}

TEST(Bf16c, RowBytesAndLengths) {
  EXPECT_EQ(kBf16cHeaderBytes, 64u);
  EXPECT_EQ(kBf16cBlockBytes, 48u);
  EXPECT_EQ(kBf16cMaxRowElements, 65504);
  EXPECT_EQ(kernels::kBf16cMaxExceptions, kMaxExceptions);
  EXPECT_EQ(kernels::isa::kBf16cHeader, kHeader);
  EXPECT_EQ(kernels::isa::kBf16cBlock, kBlockBytes);
  EXPECT_EQ(kernels::isa::kBf16cExceptionsAt, kTableBytes);
  EXPECT_EQ(kernels::isa::kBf16cNone, kNone);
  for (int64_t k = 32; k <= kMaxK; k += 32)
    ASSERT_EQ(DTypeRowBytes(DType::kBF16C, k), static_cast<size_t>(64 + 48 * k / 32)) << k;
  EXPECT_EQ(DTypeRowBytes(DType::kBF16C, 0), 0u);
  for (int64_t k : {int64_t{32}, int64_t{64}, int64_t{768}, kMaxK})
    EXPECT_TRUE(IsValidRowLength(DType::kBF16C, k)) << k;
  for (int64_t k : {int64_t{1}, int64_t{16}, int64_t{33}, int64_t{-32}, kMaxK + 32, int64_t{65536}})
    EXPECT_FALSE(IsValidRowLength(DType::kBF16C, k)) << k;
  // The longest row's indices stay below the "unused" mark.
  EXPECT_LT(kMaxK - 1, kNone);
}

TEST(Bf16c, RoundTripsNormalRowsExactly) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (float scale : {1e-3f, 0.02f, 1.0f, 1e3f}) {
    for (int64_t k :
         {int64_t{32}, int64_t{64}, int64_t{768}, int64_t{2048}, int64_t{4096}, kMaxK}) {
      SCOPED_TRACE("scale " + std::to_string(scale) + " k " + std::to_string(k));
      // Trimmed rows always pack; plain normal rows of 65504 may have too many tiny values, and
      // then must be refused (PackAndCheck compares with the independent count either way).
      const auto trimmed = NormalRow(k, scale, true, s.rng);
      EXPECT_GE(PackAndCheck(trimmed), 0);
      PackAndCheck(NormalRow(k, scale, false, s.rng));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Bf16c, RoundTripsSpecialValuesAsExceptions) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  // Each special's high byte (0x00, 0x80, 0x7F, 0xFF; 0x71, 0xF1 for +-1e30; 0x0D, 0x8D for
  // +-1e-30) is far from every scale's 16, so each is an exception. In order: +0, -0; bf16
  // subnormals; +inf, -inf; NaNs, quiet and signalling, with several payloads; the largest
  // finite values; the smallest normals; then huge and tiny outliers.
  std::vector<uint16_t> specials = {0x0000, 0x8000, 0x0001, 0x007F, 0x8001, 0x8040, 0x7F80,
                                    0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x7FFF, 0xFFFF, 0xFF81,
                                    0x7FA5, 0x7F7F, 0xFF7F, 0x0080, 0x8080};
  for (float v : {1e30f, -1e30f, 1e-30f, -1e-30f}) specials.push_back(F32ToBf16(v));
  for (float scale : {1e-3f, 0.02f, 1.0f, 1e3f}) {
    for (int64_t k : {int64_t{768}, int64_t{4096}, kMaxK}) {
      for (int rep = 0; rep < 4; ++rep) {
        SCOPED_TRACE("scale " + std::to_string(scale) + " k " + std::to_string(k));
        // The 16 ordinary high bytes each appear k/32 times or more: always more often than
        // any special, which has at most 12 copies.
        const auto highs = SixteenHighBytes(scale);
        const int n = 1 + static_cast<int>(s.rng() % kMaxExceptions);
        auto bits = RowOfHighBytes(k - n, highs, static_cast<int>(k / 32), s.rng);
        for (int e = 0; e < n; ++e)
          bits.insert(bits.begin() + s.rng() % (bits.size() + 1),
                      specials[s.rng() % specials.size()]);
        std::vector<uint8_t> row;
        ASSERT_EQ(PackAndCheck(bits, &row), n);
        // The header names exactly the special positions, ascending.
        std::vector<int64_t> at;
        for (int64_t i = 0; i < k; ++i)
          if (std::find(highs.begin(), highs.end(), bits[i] >> 8) == highs.end()) at.push_back(i);
        ASSERT_EQ(at.size(), static_cast<size_t>(n));
        for (int e = 0; e < n; ++e) {
          EXPECT_EQ(Load16(row.data() + kTableBytes + 4 * e), at[e]);
          EXPECT_EQ(Load16(row.data() + kTableBytes + 4 * e + 2), bits[at[e]]);
        }
      }
    }
  }
  // Rows that are mostly specials: they go into the table and round trip all the same.
  for (int64_t k : {int64_t{32}, int64_t{64}, int64_t{768}}) {
    std::vector<uint16_t> bits(static_cast<size_t>(k));
    for (auto& b : bits) b = specials[s.rng() % specials.size()];
    PackAndCheck(bits);
  }
}

TEST(Bf16c, RoundTripsRowsOfFewValues) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (int64_t k : {int64_t{32}, int64_t{64}, int64_t{768}, kMaxK}) {
    SCOPED_TRACE("k " + std::to_string(k));
    for (uint16_t v : {uint16_t{0x0000}, uint16_t{0x8000}, uint16_t{0x3F80}, uint16_t{0x7FC0},
                       uint16_t{0xFF80}, uint16_t{0x0001}, static_cast<uint16_t>(s.rng())}) {
      std::vector<uint8_t> row;
      EXPECT_EQ(PackAndCheck(std::vector<uint16_t>(static_cast<size_t>(k), v), &row), 0)
          << "all 0x" << std::hex << v;
      // One value: one table entry, so every element has the same code.
      const uint8_t code = row[kHeader + 32] & 15;
      for (int64_t b = 0; b < k / 32; ++b)
        for (int i = 0; i < 16; ++i)
          ASSERT_EQ(row[kHeader + b * kBlockBytes + 32 + i], code * 0x11) << "block " << b;
    }
    // 2 to 16 distinct high bytes, at random (0x00 included sometimes, which the table's padding
    // also holds): never an exception.
    for (int distinct = 2; distinct <= 16; ++distinct) {
      std::vector<uint8_t> all(256);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), s.rng);
      all.resize(static_cast<size_t>(std::min<int64_t>(distinct, k)));
      EXPECT_EQ(PackAndCheck(RowOfHighBytes(k, all, 1, s.rng)), 0) << distinct << " high bytes";
    }
    // A few distinct whole values.
    std::vector<uint16_t> values(5);
    for (auto& v : values) v = static_cast<uint16_t>(s.rng());
    std::vector<uint16_t> bits(static_cast<size_t>(k));
    for (auto& b : bits) b = values[s.rng() % values.size()];
    EXPECT_EQ(PackAndCheck(bits), 0);
    if (HasFatalFailure()) return;
  }
}

// 16 high bytes, each at least share + 1 times, and `n` elements whose high bytes are outside
// them, `share` elements per outside byte, so each is rarer than any of the 16: exactly `n`
// exceptions. Needs 16 * (share + 1) + n <= k. With `finite`, no high byte 0x7F or 0xFF, whose
// values may be inf or NaN.
std::vector<uint16_t> RowWithExceptions(int64_t k, int n, int share, std::mt19937& rng,
                                        bool finite = false) {
  std::vector<uint8_t> all;
  for (int h = 0; h < 256; ++h)
    if (!finite || (h & 0x7F) != 0x7F) all.push_back(static_cast<uint8_t>(h));
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<uint8_t> table(all.begin(), all.begin() + 16);
  const int64_t base = k - n;
  auto bits =
      RowOfHighBytes(base, table, std::max<int>(share + 1, static_cast<int>(base / 16)), rng);
  for (int e = 0; e < n; ++e)
    bits.push_back(static_cast<uint16_t>(all[16 + e / share] << 8 | (rng() & 0xFF)));
  std::shuffle(bits.begin(), bits.end(), rng);
  return bits;
}

TEST(Bf16c, TwelveExceptionsPackThirteenDoNot) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (int64_t k : {int64_t{64}, int64_t{768}, int64_t{2048}, kMaxK}) {
    for (int share : {1, 2, 3}) {
      for (int n : {0, 1, 11, 12, 13, 14, 24, 48}) {
        if (n % share != 0 || 16 * (share + 1) + n > k) continue;
        SCOPED_TRACE("k " + std::to_string(k) + " exceptions " + std::to_string(n) + " share " +
                     std::to_string(share));
        const auto bits = RowWithExceptions(k, n, share, s.rng);
        std::vector<uint8_t> row(RowBytes(k));
        const int got = PackRowBf16c(bits.data(), k, row.data());
        EXPECT_EQ(got, n <= kMaxExceptions ? n : -1);
        EXPECT_EQ(MaxBf16cExceptions(bits.data(), 1, k), n <= kMaxExceptions ? n : -1);
        EXPECT_EQ(PackAndCheck(bits), n <= kMaxExceptions ? n : -1);
      }
    }
    // All 12 exceptions in a run: in the first block, in the last, at the row's very end.
    for (int64_t first : {int64_t{0}, k - 32, k - 12}) {
      auto bits = RowWithExceptions(k - 12, 0, 1, s.rng);
      const Ranking r = Rank(bits.data(), k - 12);
      std::vector<uint16_t> run;
      for (int h = 0; run.size() < 12; ++h)
        if (!r.in_table[h]) run.push_back(static_cast<uint16_t>(h << 8 | 0x5A));
      bits.insert(bits.begin() + first, run.begin(), run.end());
      SCOPED_TRACE("k " + std::to_string(k) + " exceptions from " + std::to_string(first));
      std::vector<uint8_t> row;
      EXPECT_EQ(PackAndCheck(bits, &row), 12);
      if (row.empty()) continue;
      for (int e = 0; e < 12; ++e) EXPECT_EQ(Load16(row.data() + kTableBytes + 4 * e), first + e);
    }
    if (HasFatalFailure()) return;
  }
}

TEST(Bf16c, TableHoldsTheSixteenMostFrequentHighBytes) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (int64_t k : {int64_t{256}, int64_t{1024}, int64_t{4096}}) {
    for (int rep = 0; rep < 8; ++rep) {
      // 20 high bytes with distinct counts: the 4 rarest (1, 2, 3 and 4 times, 10 elements) are
      // the exceptions; the others 5..20 times, the most frequent taking the rest of the row.
      std::vector<uint8_t> all(256);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), s.rng);
      std::vector<uint16_t> bits;
      std::array<bool, 256> top{};
      for (int c = 0; c < 20; ++c) {
        int64_t count = c + 1;
        if (c == 19) count = k - static_cast<int64_t>(bits.size());
        if (c >= 4) top[all[c]] = true;
        for (int64_t i = 0; i < count; ++i)
          bits.push_back(static_cast<uint16_t>(all[c] << 8 | (s.rng() & 0xFF)));
      }
      std::shuffle(bits.begin(), bits.end(), s.rng);
      ASSERT_EQ(static_cast<int64_t>(bits.size()), k);
      std::vector<uint8_t> row;
      ASSERT_EQ(PackAndCheck(bits, &row), 10);
      for (int c = 0; c < 16; ++c) EXPECT_TRUE(top[row[c]]) << "table entry " << c;
    }
    // A tie for the 16th entry goes to the smaller byte: 15 frequent bytes, then 0x42 and 0x41
    // three times each.
    std::vector<uint16_t> bits;
    for (int h = 0; h < 15; ++h)
      for (int64_t i = 0; i < (k - 6) / 15; ++i)
        bits.push_back(static_cast<uint16_t>((0x90 + h) << 8));
    while (static_cast<int64_t>(bits.size()) < k - 6) bits.push_back(0x9000);
    for (int i = 0; i < 3; ++i) {
      bits.push_back(0x4201);
      bits.push_back(0x4102);
    }
    std::shuffle(bits.begin(), bits.end(), s.rng);
    std::vector<uint8_t> row;
    ASSERT_EQ(PackAndCheck(bits, &row), 3);
    EXPECT_NE(std::find(row.begin(), row.begin() + 16, 0x41), row.begin() + 16);
    EXPECT_EQ(std::find(row.begin(), row.begin() + 16, 0x42), row.begin() + 16);
  }
}

TEST(Bf16c, MaxExceptionsAgreesWithPack) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (int64_t k : {int64_t{64}, int64_t{768}, int64_t{4096}}) {
    for (int rep = 0; rep < 6; ++rep) {
      const int n_rows = 1 + static_cast<int>(s.rng() % 7);
      std::vector<uint16_t> w;
      int most = 0;
      for (int r = 0; r < n_rows; ++r) {
        const int n = static_cast<int>(s.rng() % (kMaxExceptions + 1));
        const auto bits = RowWithExceptions(k, n, 1, s.rng);
        std::vector<uint8_t> row(RowBytes(k));
        const int got = PackRowBf16c(bits.data(), k, row.data());
        EXPECT_EQ(got, n);
        most = std::max(most, got);
        w.insert(w.end(), bits.begin(), bits.end());
      }
      EXPECT_EQ(MaxBf16cExceptions(w.data(), n_rows, k), most) << n_rows << " rows, k " << k;
      // One row over the limit, anywhere, makes the matrix unconvertible.
      const int bad = static_cast<int>(s.rng() % n_rows);
      const auto over = RowWithExceptions(k, kMaxExceptions + 1, 1, s.rng);
      std::copy(over.begin(), over.end(), w.begin() + bad * k);
      EXPECT_EQ(MaxBf16cExceptions(w.data(), n_rows, k), -1) << "row " << bad << " has 13";
    }
  }
  EXPECT_EQ(MaxBf16cExceptions(nullptr, 0, 32), 0);
}

TEST(Bf16c, RowToF32OnDamagedRowsStaysInBounds) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  constexpr int kGuard = 64;
  for (int64_t k : {int64_t{32}, int64_t{64}, int64_t{96}, int64_t{1024}, kMaxK}) {
    for (int rep = 0; rep < 20; ++rep) {
      SCOPED_TRACE("k " + std::to_string(k) + " rep " + std::to_string(rep));
      std::vector<uint8_t> row(RowBytes(k));
      for (auto& b : row) b = static_cast<uint8_t>(s.rng());
      // Exception indices: random 16-bit values mostly land past k; make some land inside, in
      // any order, and some just past the end.
      for (int e = 0; e < kMaxExceptions; ++e) {
        uint8_t* x = row.data() + kTableBytes + 4 * e;
        uint32_t at = s.rng() % 0x10000;
        switch (s.rng() % 4) {
          case 0:
            at = static_cast<uint32_t>(s.rng() % k);
            break;
          case 1:
            at = static_cast<uint32_t>(k + s.rng() % 64);
            break;
          default:
            break;
        }
        if (at > 0xFFFF) at = 0xFFFF;
        x[0] = static_cast<uint8_t>(at & 0xFF);
        x[1] = static_cast<uint8_t>(at >> 8);
      }
      std::vector<float> out(static_cast<size_t>(k) + 2 * kGuard, -3.5f);
      kernels::isa::Bf16cRowToF32(row.data(), k, out.data() + kGuard);
      for (int g = 0; g < kGuard; ++g) {
        ASSERT_EQ(FloatBits(out[g]), FloatBits(-3.5f)) << "wrote before the row, guard " << g;
        ASSERT_EQ(FloatBits(out[kGuard + k + g]), FloatBits(-3.5f)) << "wrote past k, guard " << g;
      }
      const auto want = ReferenceDecode(row.data(), k);
      for (int64_t i = 0; i < k; ++i)
        ASSERT_EQ(FloatBits(out[kGuard + i]), static_cast<uint32_t>(want[i]) << 16)
            << "element " << i;
      // UnpackRowBf16c reads damaged rows the same way.
      std::vector<uint16_t> bits(static_cast<size_t>(k) + 2 * kGuard, 0xBEEF);
      UnpackRowBf16c(row.data(), k, bits.data() + kGuard);
      for (int g = 0; g < kGuard; ++g) {
        ASSERT_EQ(bits[g], 0xBEEF) << "Unpack wrote before the row";
        ASSERT_EQ(bits[kGuard + k + g], 0xBEEF) << "Unpack wrote past k";
      }
      for (int64_t i = 0; i < k; ++i) ASSERT_EQ(bits[kGuard + i], want[i]) << "element " << i;
    }
  }
  // An exception index of k, or 0xFFFF, names nothing: the row decodes as its blocks say.
  const int64_t k = 64;
  auto bits = RowWithExceptions(k, 0, 1, s.rng);
  std::vector<uint8_t> row;
  ASSERT_EQ(PackAndCheck(bits, &row), 0);
  for (uint16_t at : {static_cast<uint16_t>(k), uint16_t{0xFFFE}, kNone}) {
    auto damaged = row;
    damaged[kTableBytes] = static_cast<uint8_t>(at & 0xFF);
    damaged[kTableBytes + 1] = static_cast<uint8_t>(at >> 8);
    damaged[kTableBytes + 2] = 0x80;
    damaged[kTableBytes + 3] = 0x7F;
    std::vector<float> out(static_cast<size_t>(k) + 1, 1.0f);
    kernels::isa::Bf16cRowToF32(damaged.data(), k, out.data());
    EXPECT_EQ(out[k], 1.0f) << "index " << at;
    for (int64_t i = 0; i < k; ++i)
      ASSERT_EQ(FloatBits(out[i]), FloatBits(Bf16ToF32(bits[i]))) << "index " << at;
  }
}

TEST(Bf16c, TensorRowToF32WholeAndPartialRanges) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (int64_t k : {int64_t{32}, int64_t{96}, int64_t{768}}) {
    const int64_t rows = 5;
    std::vector<uint16_t> w;
    std::vector<uint8_t> packed;
    for (int64_t r = 0; r < rows; ++r) {
      // 32 is too short for 16 x 2 table elements and exceptions.
      const auto bits = k > 32 ? RowWithExceptions(k, static_cast<int>(s.rng() % 13), 1, s.rng)
                               : NormalRow(k, 0.02f, true, s.rng);
      std::vector<uint8_t> row(RowBytes(k));
      ASSERT_GE(PackRowBf16c(bits.data(), k, row.data()), 0);
      w.insert(w.end(), bits.begin(), bits.end());
      packed.insert(packed.end(), row.begin(), row.end());
    }
    const TensorView view{DType::kBF16C, {rows, k}, packed.data(), packed.size()};
    auto check = [&](int64_t offset, int64_t n) {
      SCOPED_TRACE("k " + std::to_string(k) + " offset " + std::to_string(offset) + " n " +
                   std::to_string(n));
      std::vector<float> out(static_cast<size_t>(n) + 16, 9.0f);
      kernels::RowToF32(view, offset, n, out.data() + 8);
      for (int g = 0; g < 8; ++g) {
        ASSERT_EQ(out[g], 9.0f) << "wrote before the range";
        ASSERT_EQ(out[8 + n + g], 9.0f) << "wrote past the range";
      }
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(FloatBits(out[8 + i]), static_cast<uint32_t>(w[offset + i]) << 16)
            << "element " << offset + i;
    };
    check(0, rows * k);
    for (int64_t r = 0; r < rows; ++r) check(r * k, k);
    check(k, 3 * k);
    // Ranges that start or end inside a row, or both, across one or several row boundaries.
    check(k - 1, 2);
    check(k / 2, k);
    check(k + 7, 2 * k - 3);
    check(1, rows * k - 2);
    check(3, 5);
    check(rows * k - 1, 1);
    for (int rep = 0; rep < 20; ++rep) {
      const int64_t a = s.rng() % (rows * k), b = s.rng() % (rows * k);
      check(std::min(a, b), std::max(a, b) - std::min(a, b) + 1);
    }
    if (HasFatalFailure()) return;
  }
}

// Tokens through DotRows (one; the few a tile holds, decoded once in registers for all of them;
// more): BF16C computes with bf16's values in bf16's order, so it matches plain bf16 weights run
// on the level it was prepared for, bit for bit.
TEST(Bf16c, DotRowsMatchesBf16) {
  Seeded s;
  SCOPED_TRACE(s.Trace());
  for (kernels::CpuIsa level : kernels::kAllCpuIsas) {
    if (!kernels::CpuSupports(level)) continue;
    for (int64_t k : {int64_t{32}, int64_t{768}, int64_t{4096}})
      for (int64_t n_tokens : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}}) {
        SCOPED_TRACE(std::string(kernels::CpuIsaName(level)) + " k " + std::to_string(k) +
                     " tokens " + std::to_string(n_tokens));
        const int64_t rows = 9;
        std::vector<uint16_t> w;
        std::vector<uint8_t> packed;
        for (int64_t r = 0; r < rows; ++r) {
          const auto bits =
              k >= 64 ? RowWithExceptions(k, static_cast<int>(s.rng() % 13), 1, s.rng, true)
                      : NormalRow(k, 0.02f, true, s.rng);
          std::vector<uint8_t> row(RowBytes(k));
          ASSERT_GE(PackRowBf16c(bits.data(), k, row.data()), 0);
          w.insert(w.end(), bits.begin(), bits.end());
          packed.insert(packed.end(), row.begin(), row.end());
        }
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(k * n_tokens));
        for (auto& v : x) v = dist(s.rng);
        kernels::PreparedActivations pc, pb;
        pc.Prepare(x.data(), n_tokens, k, DType::kBF16C, level);
        pb.Prepare(x.data(), n_tokens, k, DType::kBF16, pc.isa());
        const TensorView vc{DType::kBF16C, {rows, k}, packed.data(), packed.size()};
        const TensorView vb{DType::kBF16, {rows, k}, w.data(), w.size() * 2};
        const auto n = static_cast<size_t>(rows * n_tokens);
        std::vector<float> yc(n, NAN), yb(n, NAN);
        // Rows 2..8 in one call (a range that starts inside the matrix), then rows 0..1.
        for (auto [r0, r1] : {std::pair<int64_t, int64_t>{2, rows}, {0, 2}}) {
          kernels::DotRows(vc, r0, r1, pc, yc.data(), rows);
          kernels::DotRows(vb, r0, r1, pb, yb.data(), rows);
        }
        for (size_t i = 0; i < n; ++i) {
          if (!std::isfinite(yb[i])) continue;  // huge weights times x may overflow
          EXPECT_EQ(FloatBits(yc[i]), FloatBits(yb[i]))
              << "token " << i / rows << " row " << i % rows << ": " << yc[i] << " vs " << yb[i];
        }
      }
  }
}

}  // namespace
}  // namespace moetier
