// A fixed pool of worker threads, created once and reused for every parallel loop, so the
// decode loop never creates a thread. The calling thread works too: a pool of N threads
// runs N-1 workers plus the caller.
//
// Contract: ParallelFor is called from one thread at a time (the engine thread); it returns
// after every chunk has run. Work is split statically into contiguous ranges, so the same
// (n, n_threads) always gives every index to the same thread: results never depend on timing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moetier {

class ThreadPool {
 public:
  // n_threads <= 0 means every hardware thread the process may use.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over a partition of [0, n) into at most size() ranges.
  using RangeFn = std::function<void(size_t begin, size_t end, int thread_index)>;
  void ParallelFor(size_t n, const RangeFn& fn);

  // Number of hardware threads this process may run on (affinity mask aware).
  static int AvailableThreads();

 private:
  void WorkerLoop(int index);
  void RunShare(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped per job, guarded by mu_
  bool stopping_ = false;
  std::atomic<int> pending_{0};
  // The current job, valid while pending_ > 0.
  const RangeFn* job_ = nullptr;
  size_t job_n_ = 0;
  int job_parts_ = 0;
};

}  // namespace moetier
