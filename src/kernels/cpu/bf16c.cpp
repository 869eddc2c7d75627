#include "kernels/cpu/bf16c.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>

#include "core/dtype.h"

namespace moetier::kernels {

namespace {

static_assert(isa::kBf16cHeader == static_cast<int64_t>(kBf16cHeaderBytes) &&
                  isa::kBf16cBlock == static_cast<int64_t>(kBf16cBlockBytes),
              "matmul_isa.h and core/dtype.h must agree on the BF16C layout");
static_assert(isa::kBf16cExceptionsAt + 4 * isa::kBf16cMaxExceptions == isa::kBf16cHeader,
              "the exception list fills the header after the 16-byte table");

// The row's code table: its 16 most frequent high bytes, most frequent first (ties to the smaller
// byte), padded with 0. code_of[h] is h's code, or -1 when h is not in the table.
struct CodeTable {
  std::array<uint8_t, 16> high{};
  std::array<int, 256> code_of{};
};

CodeTable BuildTable(const uint16_t* bits, int64_t k) {
  // Four histograms: consecutive weights often share a high byte, and one table would make each
  // increment wait on the previous one's store (this runs on every row when a model loads).
  std::array<std::array<uint32_t, 256>, 4> part{};
  int64_t i = 0;
  for (; i + 4 <= k; i += 4)
    for (int p = 0; p < 4; ++p) ++part[p][bits[i + p] >> 8];
  for (; i < k; ++i) ++part[0][bits[i] >> 8];
  // Key = count above, (255 - byte) below: the largest keys are the most frequent bytes, ties
  // to the smaller byte. Only the top 16 need ordering.
  std::array<uint64_t, 256> key{};
  int n_present = 0;
  for (int h = 0; h < 256; ++h) {
    const uint64_t c = uint64_t{part[0][h]} + part[1][h] + part[2][h] + part[3][h];
    if (c > 0) key[n_present++] = c << 8 | static_cast<uint64_t>(255 - h);
  }
  const int n_top = std::min(n_present, 16);
  std::partial_sort(key.begin(), key.begin() + n_top, key.begin() + n_present,
                    std::greater<uint64_t>());
  CodeTable t;
  t.code_of.fill(-1);
  for (int c = 0; c < n_top; ++c) {
    const int h = 255 - static_cast<int>(key[c] & 0xFF);
    t.high[c] = static_cast<uint8_t>(h);
    t.code_of[h] = c;
  }
  return t;
}

int CountExceptions(const uint16_t* bits, int64_t k, const CodeTable& t) {
  int n = 0;
  for (int64_t i = 0; i < k; ++i) n += t.code_of[bits[i] >> 8] < 0;
  return n;
}

void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
}

}  // namespace

int PackRowBf16c(const uint16_t* bits, int64_t k, uint8_t* out) {
  const CodeTable t = BuildTable(bits, k);
  std::memset(out, 0, DTypeRowBytes(DType::kBF16C, k));
  std::memcpy(out, t.high.data(), t.high.size());
  for (int e = 0; e < kBf16cMaxExceptions; ++e)
    Store16(out + isa::kBf16cExceptionsAt + 4 * e, isa::kBf16cNone);
  int n_exceptions = 0;
  for (int64_t b = 0; b < k / isa::kBlock; ++b) {
    uint8_t* blk = out + isa::kBf16cHeader + b * isa::kBf16cBlock;
    const uint16_t* v = bits + b * isa::kBlock;
    for (int j = 0; j < isa::kBlock; ++j) {
      const int code = t.code_of[v[j] >> 8];
      const int s = isa::Bf16cSlot(j);
      if (code < 0) {  // slot stays code 0, lo 0; the header has the value
        if (n_exceptions == kBf16cMaxExceptions) return -1;
        uint8_t* x = out + isa::kBf16cExceptionsAt + 4 * n_exceptions++;
        Store16(x, static_cast<uint16_t>(b * isa::kBlock + j));
        Store16(x + 2, v[j]);
        continue;
      }
      blk[s] = static_cast<uint8_t>(v[j] & 0xFF);
      blk[32 + s % 16] |= static_cast<uint8_t>(s < 16 ? code : code << 4);
    }
  }
  return n_exceptions;
}

int64_t PackRowsBf16c(const uint16_t* bits, int64_t n_rows, int64_t k, uint8_t* out) {
  const size_t row_bytes = DTypeRowBytes(DType::kBF16C, k);
  for (int64_t r = 0; r < n_rows; ++r)
    if (PackRowBf16c(bits + r * k, k, out + static_cast<size_t>(r) * row_bytes) < 0) return r;
  return -1;
}

void UnpackRowBf16c(const uint8_t* row, int64_t k, uint16_t* bits) {
  for (int64_t i = 0; i < k; ++i) bits[i] = isa::Bf16cStoredBits(row, i);
  isa::Bf16cApplyExceptions(row, k, bits);
}

int MaxBf16cExceptions(const uint16_t* bits, int64_t n_rows, int64_t k) {
  int most = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int n = CountExceptions(bits + r * k, k, BuildTable(bits + r * k, k));
    if (n > kBf16cMaxExceptions) return -1;
    most = std::max(most, n);
  }
  return most;
}

}  // namespace moetier::kernels
