// ThreadPool: every index/task runs exactly once, under both hand-off paths (spinning and
// sleeping), and pinned workers each sit on one CPU.
#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

namespace moetier {
namespace {

// Sets an environment variable for the lifetime of the object (pools read it at construction).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

void ExpectEveryIndexOnce(ThreadPool& pool, size_t n) {
  std::vector<std::atomic<int>> hits(n);
  pool.ParallelFor(n, [&](size_t b, size_t e, int t) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, pool.size());
    for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  std::vector<std::atomic<int>> task_hits(n);
  pool.ParallelTasks(n, [&](size_t task, int t) {
    ASSERT_LT(t, pool.size());
    task_hits[task].fetch_add(1);
  });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(task_hits[i].load(), 1) << "task " << i << " of " << n;
}

TEST(ThreadPool, EveryIndexAndTaskRunsOnceWhileSpinning) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads, /*pin=*/false);
    ASSERT_EQ(pool.size(), threads);
    for (size_t n : {1, 2, 3, 7, 64, 1000})
      for (int rep = 0; rep < 50; ++rep) ExpectEveryIndexOnce(pool, n);
  }
}

TEST(ThreadPool, EveryIndexAndTaskRunsOnceWhenThreadsSleepBetweenJobs) {
  ScopedEnv spin("MOETIER_SPIN_US", "0");  // every wait goes to the futex at once
  ThreadPool pool(3, /*pin=*/false);
  for (int rep = 0; rep < 300; ++rep) {
    ExpectEveryIndexOnce(pool, 1 + static_cast<size_t>(rep % 17));
    if (rep % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(ThreadPool, SlowPiecesAreWaitedFor) {
  ScopedEnv spin("MOETIER_SPIN_US", "10");  // the caller goes to sleep while a piece runs
  ThreadPool pool(2, /*pin=*/false);
  std::atomic<int> done{0};
  pool.ParallelTasks(4, [&](size_t, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    done.fetch_add(1);
  });
  EXPECT_EQ(done.load(), 4);
}

TEST(ThreadPool, DefaultIsThePhysicalCores) {
  EXPECT_GE(ThreadPool::DefaultThreads(), 1);
  EXPECT_LE(ThreadPool::DefaultThreads(), ThreadPool::AvailableThreads());
  ThreadPool pool;
  EXPECT_EQ(pool.size(), ThreadPool::DefaultThreads());
}

TEST(ThreadPool, PinnedWorkersEachRunOnTheirOwnCpu) {
  const int n = ThreadPool::DefaultThreads();
  if (n < 2) GTEST_SKIP() << "one physical core: nothing to pin";
  ThreadPool pool(n, /*pin=*/true);
  if (!pool.pinned()) GTEST_SKIP() << "the OS refused to set thread affinity here";
  std::vector<int> cpu_of(static_cast<size_t>(n), -1);
  pool.ParallelFor(static_cast<size_t>(n), [&](size_t, size_t, int t) {
    if (t == 0) return;  // the caller is not pinned
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    ASSERT_EQ(CPU_COUNT(&set), 1) << "worker " << t;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpu_of[static_cast<size_t>(t)] = c;
  });
  std::set<int> distinct(cpu_of.begin() + 1, cpu_of.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(n - 1));
  EXPECT_EQ(distinct.count(-1), 0u);
  // A pinned pool must not shrink what later pools see.
  EXPECT_EQ(ThreadPool::DefaultThreads(), n);
}

// A caller the scheduler left on a worker's CPU would hold that worker's core while it waits
// for it: a job runs its caller off the workers' CPUs, and gives the caller its mask back.
TEST(ThreadPool, AJobRunsItsCallerOffTheWorkersCpus) {
  const int n = ThreadPool::DefaultThreads();
  if (n < 2) GTEST_SKIP() << "one physical core: nothing to pin";
  // On a thread of its own: the test thread's affinity stays as it was.
  std::thread([n] {
    ThreadPool pool(n, /*pin=*/true);
    if (!pool.pinned()) GTEST_SKIP() << "the OS refused to set thread affinity here";
    cpu_set_t all;
    CPU_ZERO(&all);
    ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
    int worker_cpu = -1, free_cpu = -1;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &all)) continue;
      int& slot = pool.IsWorkerCpu(c) ? worker_cpu : free_cpu;
      if (slot < 0) slot = c;
    }
    ASSERT_GE(worker_cpu, 0);
    ASSERT_GE(free_cpu, 0) << "core 0 is left to the caller";
    cpu_set_t set;
    bool placed = false;
    for (int attempt = 0; attempt < 20 && !placed; ++attempt) {
      // Onto the worker's CPU alone, then allowed the free one too: the thread stays put
      // until something moves it.
      CPU_ZERO(&set);
      CPU_SET(worker_cpu, &set);
      ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
      CPU_SET(free_cpu, &set);
      ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
      placed = sched_getcpu() == worker_cpu;  // else the scheduler moved it first: again
    }
    ASSERT_TRUE(placed) << "could not place the thread on CPU " << worker_cpu;
    int caller_cpu = -1;
    std::atomic<int> ran{0};
    pool.ParallelFor(static_cast<size_t>(n), [&](size_t, size_t, int t) {
      if (t == 0) caller_cpu = sched_getcpu();
      ran.fetch_add(1);
    });
    EXPECT_EQ(ran.load(), n);
    EXPECT_EQ(caller_cpu, free_cpu);
    cpu_set_t after;
    CPU_ZERO(&after);
    ASSERT_EQ(sched_getaffinity(0, sizeof after, &after), 0);
    EXPECT_TRUE(CPU_EQUAL(&after, &set)) << "the caller's mask is given back";
  }).join();
}

// The knobs are read once per process (Tuning()), and an earlier test here has read them: the
// check runs in a fresh process ("threadsafe" death tests re-run the binary for this test alone).
TEST(ThreadPool, PinningCanBeTurnedOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScopedEnv off("MOETIER_PIN_THREADS", "0");
  EXPECT_EXIT(
      {
        ThreadPool pool(2);
        std::exit(!ThreadPool::PinThreads() && !pool.pinned() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace moetier
