// StagingRing: host bytes that CUDA cannot DMA from directly reach device memory exactly, for
// ranges larger than the ring, many small unaligned ones, and a locked malloc'd buffer; a second
// copy right after the first (the chunks reused) is exact too, and the source may change as soon
// as Copy returns.
#include "backend/cuda/staging_ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "support/gpu.h"

namespace moetier {
namespace {

using cuda::StagingRing;
using Range = StagingRing::Range;

constexpr size_t kMiB = size_t{1} << 20;
constexpr uint64_t kSeed = 20240611;

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// A non-blocking stream, destroyed at scope exit.
class Stream {
 public:
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { (void)cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Device bytes filled with `fill`, so untouched bytes are recognizable.
cuda::DeviceBuffer<std::byte> DeviceBytes(size_t n, int fill) {
  auto b = cuda::DeviceBuffer<std::byte>::Create(n, "staging ring test").value();
  EXPECT_EQ(cudaMemset(b.data(), fill, n), cudaSuccess);
  return b;
}

// The device bytes after `stream` has run.
std::vector<std::byte> Read(const cuda::DeviceBuffer<std::byte>& b, cudaStream_t stream) {
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<std::byte> v(b.size());
  EXPECT_EQ(cudaMemcpy(v.data(), b.data(), b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// The index of the first byte where a and b differ, or -1.
int64_t FirstMismatch(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

TEST(StagingRing, RejectsTooFewOrEmptyChunks) {
  // Checked before any CUDA call: runs without a GPU too.
  auto one = StagingRing::Create(kMiB, 1);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.message().find("at least 2 chunks"), std::string::npos) << one.message();
  EXPECT_FALSE(StagingRing::Create(0, 4).ok());
}

TEST(StagingRing, OneRangeLargerThanSeveralChunks) {
  MT_REQUIRE_GPU();
  auto ring = StagingRing::Create(kMiB, 3);
  ASSERT_TRUE(ring.ok()) << ring.message();
  ThreadPool pool(4);
  Stream stream;
  // Unaligned at both ends, ~7.5 chunks: every chunk reused, the last one partly filled.
  const size_t bytes = 7 * kMiB + 12345;
  const std::vector<std::byte> src = RandomBytes(bytes + 3, kSeed);
  auto dst = DeviceBytes(bytes + 10, 0xAB);
  const Range range{src.data() + 3, dst.data() + 5, bytes};
  ASSERT_TRUE((*ring)->Copy({&range, 1}, stream.get(), &pool).ok());
  std::vector<std::byte> want(bytes + 10, std::byte{0xAB});
  std::memcpy(want.data() + 5, src.data() + 3, bytes);
  EXPECT_EQ(FirstMismatch(Read(dst, stream.get()), want), -1);
  EXPECT_EQ((*ring)->bytes_staged(), bytes);
  EXPECT_GT((*ring)->copy_seconds(), 0.0);
}

TEST(StagingRing, ManySmallUnalignedRanges) {
  MT_REQUIRE_GPU();
  SCOPED_TRACE("seed " + std::to_string(kSeed));
  auto ring = StagingRing::Create(64 * 1024, 2);
  ASSERT_TRUE(ring.ok()) << ring.message();
  ThreadPool pool(4);
  Stream stream;
  std::mt19937_64 rng(kSeed);
  const size_t src_bytes = 4 * kMiB;
  const std::vector<std::byte> src = RandomBytes(src_bytes, kSeed + 1);
  // Ranges at random source offsets; on the device, some follow the previous range (one DMA),
  // some leave a gap that must keep its fill, some are empty; a few span chunk boundaries.
  std::vector<Range> ranges;
  std::vector<std::byte> want;
  const size_t dst_bytes = 6 * kMiB;
  auto dst = DeviceBytes(dst_bytes, 0x5A);
  want.assign(dst_bytes, std::byte{0x5A});
  size_t at = 0;
  uint64_t total = 0;
  for (int i = 0; i < 3000; ++i) {
    const size_t n = rng() % 5 == 0 ? 0 : (rng() % 8 == 0 ? 1 + rng() % 100000 : 1 + rng() % 3000);
    const size_t gap = rng() % 2 == 0 ? 0 : rng() % 64;
    if (at + gap + n > dst_bytes) break;
    at += gap;
    const size_t from = rng() % (src_bytes - n);
    ranges.push_back(Range{src.data() + from, dst.data() + at, n});
    std::memcpy(want.data() + at, src.data() + from, n);
    at += n;
    total += n;
  }
  ASSERT_GT(ranges.size(), 500u);
  ASSERT_TRUE((*ring)->Copy(ranges, stream.get(), &pool).ok());
  EXPECT_EQ(FirstMismatch(Read(dst, stream.get()), want), -1);
  EXPECT_EQ((*ring)->bytes_staged(), total);
}

TEST(StagingRing, FromALockedMallocBuffer) {
  MT_REQUIRE_GPU();
  const size_t bytes = 6 * kMiB + 777;
  auto* host = static_cast<std::byte*>(std::malloc(bytes));
  ASSERT_NE(host, nullptr);
  const std::vector<std::byte> data = RandomBytes(bytes, kSeed + 2);
  std::memcpy(host, data.data(), bytes);
  // Locked like a `locked` tier bank where RLIMIT_MEMLOCK allows; plain malloc'd memory else.
  const bool locked = mlock(host, bytes) == 0;
  std::printf("[          ] source buffer %s\n", locked ? "mlock'ed" : "not lockable here: plain");
  auto ring = StagingRing::Create(kMiB, 2);
  ASSERT_TRUE(ring.ok()) << ring.message();
  ThreadPool pool(4);
  Stream stream;
  auto dst = DeviceBytes(bytes, 0);
  // Three ranges, the middle one first: dst order need not follow src order.
  const size_t a = 2 * kMiB + 1, b = 3 * kMiB - 5;
  const Range ranges[] = {{host + a, dst.data() + a, b},
                          {host, dst.data(), a},
                          {host + a + b, dst.data() + a + b, bytes - a - b}};
  ASSERT_TRUE((*ring)->Copy(ranges, stream.get(), &pool).ok());
  EXPECT_EQ(FirstMismatch(Read(dst, stream.get()), data), -1);
  if (locked) munlock(host, bytes);
  std::free(host);
}

TEST(StagingRing, EmptyCallsQueueNothing) {
  MT_REQUIRE_GPU();
  auto ring = StagingRing::Create(kMiB, 2);
  ASSERT_TRUE(ring.ok()) << ring.message();
  Stream stream;
  EXPECT_TRUE((*ring)->Copy({}, stream.get(), nullptr).ok());
  const Range empty[] = {{nullptr, nullptr, 0}, {nullptr, nullptr, 0}};
  EXPECT_TRUE((*ring)->Copy(empty, stream.get(), nullptr).ok());
  EXPECT_EQ((*ring)->bytes_staged(), 0u);
  EXPECT_TRUE((*ring)->Drain().ok());
}

TEST(StagingRing, ANullPointerIsAnErrorNamingTheRange) {
  MT_REQUIRE_GPU();
  auto ring = StagingRing::Create(kMiB, 2);
  ASSERT_TRUE(ring.ok()) << ring.message();
  Stream stream;
  std::vector<std::byte> src(16);
  const Range ranges[] = {{src.data(), nullptr, 16}};
  const Status s = (*ring)->Copy(ranges, stream.get(), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("range 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("destination"), std::string::npos) << s.message();
}

TEST(StagingRing, ASecondCopyRightAfterTheFirstReusesTheChunks) {
  MT_REQUIRE_GPU();
  auto ring = StagingRing::Create(256 * 1024, 2);
  ASSERT_TRUE(ring.ok()) << ring.message();
  ThreadPool pool(4);
  Stream stream;
  const size_t bytes = 3 * kMiB + 99;  // past both chunks, so the second copy waits on the first
  std::vector<std::byte> first = RandomBytes(bytes, kSeed + 3);
  const std::vector<std::byte> first_copy = first;
  const std::vector<std::byte> second = RandomBytes(bytes, kSeed + 4);
  auto dst_a = DeviceBytes(bytes, 0);
  auto dst_b = DeviceBytes(bytes, 0);
  const Range to_a{first.data(), dst_a.data(), bytes};
  const Range to_b{second.data(), dst_b.data(), bytes};
  // The stream held for 50 ms first: the DMAs wait, so refilling a chunk must wait for them.
  ASSERT_EQ(cudaLaunchHostFunc(
                stream.get(),
                [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr),
            cudaSuccess);
  ASSERT_TRUE((*ring)->Copy({&to_a, 1}, stream.get(), &pool).ok());
  EXPECT_GT((*ring)->wait_seconds(), 0.03) << "the ring refilled a chunk its DMA had not read";
  // Every byte is staged once Copy returns: the source may change at once.
  std::memset(first.data(), 0xEE, bytes);
  // Nothing synchronized in between: no chunk may be refilled while its DMA still reads it.
  ASSERT_TRUE((*ring)->Copy({&to_b, 1}, stream.get(), &pool).ok());
  EXPECT_EQ(FirstMismatch(Read(dst_a, stream.get()), first_copy), -1);
  EXPECT_EQ(FirstMismatch(Read(dst_b, stream.get()), second), -1);
  // The same device bytes again, by the calling thread: the later copy wins.
  const Range to_a_again{second.data(), dst_a.data(), bytes};
  ASSERT_TRUE((*ring)->Copy({&to_b, 1}, stream.get(), nullptr).ok());
  ASSERT_TRUE((*ring)->Copy({&to_a_again, 1}, stream.get(), nullptr).ok());
  EXPECT_EQ(FirstMismatch(Read(dst_a, stream.get()), second), -1);
  EXPECT_EQ(FirstMismatch(Read(dst_b, stream.get()), second), -1);
  EXPECT_EQ((*ring)->bytes_staged(), 4 * static_cast<uint64_t>(bytes));
}

}  // namespace
}  // namespace moetier
