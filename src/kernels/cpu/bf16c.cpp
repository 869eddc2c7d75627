#include "kernels/cpu/bf16c.h"

#include <algorithm>
#include <array>
#include <cstring>

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
  std::array<int64_t, 256> count{};
  for (int64_t i = 0; i < k; ++i) ++count[bits[i] >> 8];
  std::array<int, 256> order{};
  for (int h = 0; h < 256; ++h) order[h] = h;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return count[a] > count[b]; });
  CodeTable t;
  t.code_of.fill(-1);
  for (int c = 0; c < 16 && count[order[c]] > 0; ++c) {
    t.high[c] = static_cast<uint8_t>(order[c]);
    t.code_of[order[c]] = c;
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
  if (CountExceptions(bits, k, t) > kBf16cMaxExceptions) return -1;
  std::memset(out, 0, DTypeRowBytes(DType::kBF16C, k));
  std::memcpy(out, t.high.data(), t.high.size());
  for (int e = 0; e < kBf16cMaxExceptions; ++e)
    Store16(out + isa::kBf16cExceptionsAt + 4 * e, isa::kBf16cNone);
  int n_exceptions = 0;
  for (int64_t b = 0; b < k / isa::kBlock; ++b) {
    uint8_t* blk = out + isa::kBf16cHeader + b * isa::kBf16cBlock;
    for (int j = 0; j < isa::kBlock; ++j) {
      const int64_t i = b * isa::kBlock + j;
      const int code = t.code_of[bits[i] >> 8];
      const int s = isa::Bf16cSlot(j);
      if (code < 0) {  // slot stays code 0, lo 0; the header has the value
        uint8_t* x = out + isa::kBf16cExceptionsAt + 4 * n_exceptions++;
        Store16(x, static_cast<uint16_t>(i));
        Store16(x + 2, bits[i]);
        continue;
      }
      blk[s] = static_cast<uint8_t>(bits[i] & 0xFF);
      blk[32 + s % 16] |= static_cast<uint8_t>(s < 16 ? code : code << 4);
    }
  }
  return n_exceptions;
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
