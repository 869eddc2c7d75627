// HostFlag: a stream waits for the host's flag, then runs what was queued after it (a copy of
// what the host wrote before publishing); a flag never published times out and says so.
#include "kernels/cuda/host_flag.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "support/gpu.h"

namespace moetier {
namespace {

using Clock = std::chrono::steady_clock;

TEST(HostFlag, TheStreamWaitsForThePublishedValue) {
  MT_REQUIRE_GPU();
  auto flag = cuda::HostFlag::Create();
  ASSERT_TRUE(flag.ok()) << flag.message();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4 * sizeof(float)), cudaSuccess);
  auto dev = cuda::DeviceBuffer<float>::Create(4, "test");
  ASSERT_TRUE(dev.ok());
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) pinned[i] = -1.0f;
    const uint32_t value = flag->Next();
    flag->QueueWait(value, 10000, stream);
    ASSERT_EQ(
        cudaMemcpyAsync(dev->data(), pinned, 4 * sizeof(float), cudaMemcpyHostToDevice, stream),
        cudaSuccess);
    const auto t0 = Clock::now();
    std::thread host([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      for (int i = 0; i < 4; ++i) pinned[i] = static_cast<float>(round * 10 + i);
      flag->Publish(value);
    });
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    host.join();
    EXPECT_GE(waited, 0.025) << "the stream did not wait for the host";
    EXPECT_FALSE(flag->TimedOut());
    const std::vector<float> got = testing::Download(*dev, 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], round * 10 + i);
  }
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(HostFlag, AnUnansweredWaitTimesOut) {
  MT_REQUIRE_GPU();
  auto flag = cuda::HostFlag::Create();
  ASSERT_TRUE(flag.ok()) << flag.message();
  const uint32_t value = flag->Next();
  const auto t0 = Clock::now();
  flag->QueueWait(value, 50, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(flag->TimedOut());
  EXPECT_GE(waited, 0.045);
  EXPECT_LT(waited, 5.0);
  flag->Clear();
  EXPECT_FALSE(flag->TimedOut());
  // A value already published does not wait.
  flag->Publish(value);
  flag->QueueWait(value, 50, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_FALSE(flag->TimedOut());
}

}  // namespace
}  // namespace moetier
