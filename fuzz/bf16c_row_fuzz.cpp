// Fuzzes the BF16C decoders (kernels/cpu/bf16c.h, matmul_isa.h) on rows read from a weight file,
// which may be damaged: every decoder must stay inside its row and its output and agree with
// the others, and a row that keeps the format's rules must give plain bf16's products bit for bit.
//
// Input: byte 0 picks k = 32 * (1 + byte % 32) (32..1024); the rest is whole rows of
// DTypeRowBytes(kBF16C, k) bytes (a trailing partial row is ignored).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_isa.h"

namespace {

using moetier::DType;

// The format's rule as the SIMD decoder relies on it: the exceptions that name an element
// (index < k) come first, strictly ascending; entries after them name none (0xFFFF when written
// by the encoder; any index >= k is ignored alike).
bool ExceptionsInOrder(const uint8_t* row, int64_t k) {
  int64_t last = -1;
  bool ended = false;
  for (int e = 0; e < moetier::kernels::kBf16cMaxExceptions; ++e) {
    const int64_t at =
        moetier::kernels::isa::Bf16cLoad16(row + moetier::kernels::isa::kBf16cExceptionsAt + 4 * e);
    if (at >= k) {
      ended = true;
    } else if (ended || at <= last) {
      return false;
    } else {
      last = at;
    }
  }
  return true;
}

bool AllFinite(const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return false;
  return true;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace kn = moetier::kernels;
  if (size < 1) return 0;
  const int64_t k = 32 * (1 + data[0] % 32);
  const size_t row_bytes = moetier::DTypeRowBytes(DType::kBF16C, k);
  const int64_t rows = static_cast<int64_t>((size - 1) / row_bytes);
  if (rows == 0) return 0;
  // A copy of exactly the rows, so a read past the last one is a sanitizer error.
  const std::vector<uint8_t> w(data + 1, data + 1 + rows * row_bytes);

  // The scalar decoders agree bit for bit, whatever the bytes.
  std::vector<float> f(static_cast<size_t>(rows * k));
  std::vector<uint16_t> bits(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    kn::isa::Bf16cRowToF32(w.data() + r * row_bytes, k, f.data() + r * k);
    kn::UnpackRowBf16c(w.data() + r * row_bytes, k, bits.data() + r * k);
  }
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    Check(u == static_cast<uint32_t>(bits[i]) << 16);
  }

  // The tensor-level conversion, whole and across a row boundary, gives the same bits.
  const moetier::TensorView view{DType::kBF16C, {rows, k}, w.data(), w.size()};
  std::vector<float> g(f.size());
  kn::RowToF32(view, 0, rows * k, g.data());
  Check(std::memcmp(g.data(), f.data(), f.size() * sizeof(float)) == 0);
  const int64_t from = k / 2 + data[0] / 32, n = rows * k - from - k / 3;
  if (n > 0) {
    kn::RowToF32(view, from, n, g.data());
    Check(std::memcmp(g.data(), f.data() + from, static_cast<size_t>(n) * sizeof(float)) == 0);
  }

  // Products through the active level with 1 and 3 tokens of fixed activations: any values,
  // never a crash.
  std::vector<float> x(static_cast<size_t>(3 * k));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>(i * 37 % 64) - 32) / 16;
  kn::PreparedActivations pc;
  std::vector<float> y3(static_cast<size_t>(3 * rows));
  pc.Prepare(x.data(), 3, k, DType::kBF16C);
  kn::DotRows(view, 0, rows, pc, y3.data(), rows);
  std::vector<float> yc(static_cast<size_t>(rows)), yb(static_cast<size_t>(rows));
  pc.Prepare(x.data(), 1, k, DType::kBF16C);
  kn::DotRows(view, 0, rows, pc, yc.data(), rows);

  // Rows that keep the format's rules compute exactly what plain bf16 weights holding the same
  // bits do on the same level (when nothing overflows or is NaN, whose bits may differ).
  kn::PreparedActivations pb;
  pb.Prepare(x.data(), 1, k, DType::kBF16, pc.isa());
  const moetier::TensorView plain{DType::kBF16, {rows, k}, bits.data(), bits.size() * 2};
  kn::DotRows(plain, 0, rows, pb, yb.data(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (!ExceptionsInOrder(w.data() + r * row_bytes, k)) continue;
    if (!AllFinite(f.data() + r * k, k) || !std::isfinite(yc[r]) || !std::isfinite(yb[r])) continue;
    Check(std::memcmp(&yc[r], &yb[r], sizeof(float)) == 0);
  }
  return 0;
}
