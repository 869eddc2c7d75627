// The device expansion of BF16C rows and experts (kernels/cuda/bf16c_expand.h) against the
// CPU's UnpackRowBf16c (kernels/cpu/bf16c.h) and the bf16 they packed, bit for bit, on fresh
// random weights.
#include "kernels/cuda/bf16c_expand.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16c.h"
#include "kernels/cuda/device_buffer.h"
#include "support/gpu.h"
#include "support/seed.h"

namespace moetier::cuda {
namespace {

using moetier::testing::Download;
using moetier::testing::Upload;

// rows x k random bf16 weights around `scale`, with a few outliers (values far from the rest, and
// zeros) in some rows, so that rows carry exceptions.
std::vector<uint16_t> RandomBf16(int64_t rows, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::uniform_int_distribution<int64_t> col(0, k - 1);
  std::uniform_int_distribution<int> outliers(0, 6);
  std::vector<uint16_t> bits(static_cast<size_t>(rows * k));
  for (uint16_t& b : bits) b = F32ToBf16(dist(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int n = outliers(rng); n > 0; --n)
      bits[static_cast<size_t>(r * k + col(rng))] =
          F32ToBf16(n % 3 == 0 ? 0.0f : (n % 3 == 1 ? 3.0e4f : -7.0e-20f));
  return bits;
}

// One expert's gate, up and down packed back to back (ExpertLayout's order), and its bf16 rows in
// the same order (what the slot must hold).
struct PackedExpert {
  std::vector<uint8_t> packed;
  std::vector<uint16_t> expanded;
};

PackedExpert MakeExpert(int64_t d_model, int64_t width, std::mt19937& rng) {
  PackedExpert x;
  for (auto [rows, k] : {std::pair{width, d_model}, {width, d_model}, {d_model, width}}) {
    const std::vector<uint16_t> bits = RandomBf16(rows, k, rng);
    const size_t at = x.packed.size();
    x.packed.resize(at + static_cast<size_t>(rows) * DTypeRowBytes(DType::kBF16C, k));
    EXPECT_EQ(kernels::PackRowsBf16c(bits.data(), rows, k, x.packed.data() + at), -1);
    x.expanded.insert(x.expanded.end(), bits.begin(), bits.end());
  }
  return x;
}

// What UnpackRowBf16c makes of every row of an expert's packed bytes.
std::vector<uint16_t> UnpackOnCpu(const uint8_t* packed, int64_t d_model, int64_t width) {
  std::vector<uint16_t> out;
  for (auto [rows, k] : {std::pair{width, d_model}, {width, d_model}, {d_model, width}}) {
    const size_t row_bytes = DTypeRowBytes(DType::kBF16C, k);
    std::vector<uint16_t> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r, packed += row_bytes) {
      kernels::UnpackRowBf16c(packed, k, row.data());
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  return out;
}

// n experts expanded on the device from one packed buffer into slots `slot_elems` apart, in an
// order other than the packed one; returns the slots.
std::vector<uint16_t> ExpandOnGpu(const std::vector<uint8_t>& all_packed, size_t packed_stride,
                                  int n, int64_t d_model, int64_t width, size_t slot_elems) {
  const DeviceBuffer<uint8_t> d_packed = Upload(all_packed);
  DeviceBuffer<uint16_t> d_slots =
      DeviceBuffer<uint16_t>::Create(slot_elems * static_cast<size_t>(n), "slots").value();
  EXPECT_EQ(cudaMemset(d_slots.data(), 0xAB, d_slots.bytes()), cudaSuccess);
  std::vector<Bf16cExpansion> jobs;
  for (int e = 0; e < n; ++e) {
    const int slot = n - 1 - e;  // slots in reverse order
    jobs.push_back(
        {d_packed.data() + static_cast<size_t>(e) * packed_stride,
         reinterpret_cast<uint8_t*>(d_slots.data() + static_cast<size_t>(slot) * slot_elems)});
  }
  LaunchExpandBf16c(jobs, d_model, width, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  return Download(d_slots, slot_elems * static_cast<size_t>(n));
}

TEST(Bf16cExpandTest, ExpertsExpandToTheirBf16BitForBit) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  // Shapes: the smallest, Qwen3-30B-A3B's (2048 x 768), rows longer than a warp's 32 blocks; and
  // more experts than one launch takes (64).
  for (auto [d_model, width, n] : {std::tuple{32, 64, 3}, {2048, 768, 5}, {1152, 96, 70}}) {
    SCOPED_TRACE(::testing::Message() << d_model << " x " << width << ", " << n << " experts");
    std::vector<PackedExpert> experts;
    std::vector<uint8_t> all;
    size_t stride = 0;
    for (int e = 0; e < n; ++e) {
      experts.push_back(MakeExpert(d_model, width, rng));
      stride = (experts.back().packed.size() + 4095) / 4096 * 4096;  // a bank's expert stride
    }
    for (const PackedExpert& x : experts) {
      std::vector<uint8_t> padded = x.packed;
      padded.resize(stride, 0x5A);
      all.insert(all.end(), padded.begin(), padded.end());
    }
    const size_t slot_elems = experts[0].expanded.size() + 64;  // slots wider than an expert
    const std::vector<uint16_t> got = ExpandOnGpu(all, stride, n, d_model, width, slot_elems);
    for (int e = 0; e < n; ++e) {
      const uint16_t* slot = got.data() + static_cast<size_t>(n - 1 - e) * slot_elems;
      const std::vector<uint16_t>& want = experts[static_cast<size_t>(e)].expanded;
      ASSERT_EQ(std::memcmp(slot, want.data(), want.size() * 2), 0) << "expert " << e;
      for (size_t i = want.size(); i < slot_elems; ++i)
        ASSERT_EQ(slot[i], 0xABAB) << "expert " << e << " wrote past its slot";
    }
  }
}

// Runs of rows of any length and count in one call (dense matrices: one run each), more runs than
// a launch takes.
TEST(Bf16cExpandTest, RowRunsExpandToTheirBf16BitForBit) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  std::uniform_int_distribution<int64_t> blocks(1, 80), n_rows(1, 40);
  std::vector<uint8_t> packed;
  std::vector<std::vector<uint16_t>> want;
  std::vector<std::pair<size_t, size_t>> at;  // each run's packed offset and output offset
  std::vector<std::pair<int64_t, int64_t>> shape;
  size_t out_elems = 0;
  for (int run = 0; run < 70; ++run) {
    const int64_t k = 32 * blocks(rng), rows = n_rows(rng);
    want.push_back(RandomBf16(rows, k, rng));
    at.emplace_back(packed.size(), out_elems);
    shape.emplace_back(rows, k);
    packed.resize(packed.size() + static_cast<size_t>(rows) * DTypeRowBytes(DType::kBF16C, k));
    ASSERT_EQ(kernels::PackRowsBf16c(want.back().data(), rows, k, packed.data() + at.back().first),
              -1);
    out_elems += static_cast<size_t>(rows * k) + 8;  // 16 bytes of gap, 16-byte aligned
  }
  const DeviceBuffer<uint8_t> d_packed = Upload(packed);
  DeviceBuffer<uint16_t> d_out = DeviceBuffer<uint16_t>::Create(out_elems, "rows").value();
  ASSERT_EQ(cudaMemset(d_out.data(), 0xAB, d_out.bytes()), cudaSuccess);
  std::vector<Bf16cRows> runs;
  for (size_t i = 0; i < want.size(); ++i)
    runs.push_back({d_packed.data() + at[i].first,
                    reinterpret_cast<uint8_t*>(d_out.data() + at[i].second), shape[i].first,
                    shape[i].second});
  LaunchExpandBf16cRows(runs, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<uint16_t> got = Download(d_out, out_elems);
  for (size_t i = 0; i < want.size(); ++i) {
    const uint16_t* o = got.data() + at[i].second;
    ASSERT_EQ(std::memcmp(o, want[i].data(), want[i].size() * 2), 0) << "run " << i;
    for (size_t g = 0; g < 8; ++g) ASSERT_EQ(o[want[i].size() + g], 0xABAB) << "run " << i;
  }
}

TEST(Bf16cExpandTest, DamagedExceptionListsDecodeAsTheCpuDoes) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const int64_t d_model = 64, width = 32;
  PackedExpert x = MakeExpert(d_model, width, rng);
  // Every row's list rewritten: an index past the row (ignored), the same index twice (the later
  // one wins), and entries after an unused one (still applied).
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  uint8_t* row = x.packed.data();
  for (auto [rows, k] : {std::pair{width, d_model}, {width, d_model}, {d_model, width}}) {
    for (int64_t r = 0; r < rows; ++r, row += DTypeRowBytes(DType::kBF16C, k)) {
      const int at[12] = {5, 5, 0xFFFF, static_cast<int>(k), 1000, 7, 0, 0xFFFF, 3, 3, 31, 2};
      for (int e = 0; e < 12; ++e) {
        uint8_t* p = row + 16 + 4 * e;
        const int b = bits(rng);
        p[0] = static_cast<uint8_t>(at[e] & 0xFF), p[1] = static_cast<uint8_t>(at[e] >> 8);
        p[2] = static_cast<uint8_t>(b & 0xFF), p[3] = static_cast<uint8_t>(b >> 8);
      }
    }
  }
  const std::vector<uint16_t> want = UnpackOnCpu(x.packed.data(), d_model, width);
  const std::vector<uint16_t> got =
      ExpandOnGpu(x.packed, x.packed.size(), 1, d_model, width, want.size());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 2), 0);
}

// What expanding costs next to copying (EXPERT_TIMING=1 in scripts/gpu_suite.sh runs it): 8
// and 40 Qwen3-30B-A3B experts (a decode step's misses at 1 and 16 sequences), GB/s of packed
// bytes read plus bf16 written.
TEST(Bf16cExpandBench, DISABLED_Experts) {
  MT_REQUIRE_GPU();
  std::mt19937 rng(testing::TestSeed());
  const int64_t d_model = 2048, width = 768;
  const PackedExpert x = MakeExpert(d_model, width, rng);
  const size_t stride = (x.packed.size() + 4095) / 4096 * 4096;
  const size_t slot_bytes = x.expanded.size() * 2;
  for (int n : {8, 40}) {
    std::vector<uint8_t> all(stride * static_cast<size_t>(n));
    for (int e = 0; e < n; ++e)
      std::copy(x.packed.begin(), x.packed.end(), all.begin() + e * stride);
    const DeviceBuffer<uint8_t> d_packed = Upload(all);
    DeviceBuffer<uint8_t> d_slots =
        DeviceBuffer<uint8_t>::Create(slot_bytes * static_cast<size_t>(n), "slots").value();
    std::vector<Bf16cExpansion> jobs;
    for (int e = 0; e < n; ++e)
      jobs.push_back({d_packed.data() + e * stride, d_slots.data() + e * slot_bytes});
    const double ms =
        testing::MedianGpuMs([&] { LaunchExpandBf16c(jobs, d_model, width, nullptr); });
    const double bytes = static_cast<double>(n) * static_cast<double>(x.packed.size() + slot_bytes);
    std::printf("expand: %d experts %lldx%lld: %.1f us, %.0f GB/s\n", n,
                static_cast<long long>(d_model), static_cast<long long>(width), ms * 1e3,
                bytes / (ms * 1e-3) / 1e9);
  }
}

}  // namespace
}  // namespace moetier::cuda
