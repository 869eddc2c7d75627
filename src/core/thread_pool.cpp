#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

namespace moetier {

int ThreadPool::AvailableThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : AvailableThreads()) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunShare(int index) {
  if (index >= job_parts_) return;
  const size_t per = job_n_ / static_cast<size_t>(job_parts_);
  const size_t extra = job_n_ % static_cast<size_t>(job_parts_);
  const size_t i = static_cast<size_t>(index);
  const size_t begin = i * per + std::min(i, extra);
  const size_t end = begin + per + (i < extra ? 1 : 0);
  if (begin < end) (*job_)(begin, end, index);
}

void ThreadPool::ParallelFor(size_t n, const RangeFn& fn) {
  if (n == 0) return;
  const int parts = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(n_threads_)));
  if (parts == 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_.store(n_threads_ - 1, std::memory_order_release);
    ++generation_;
  }
  start_cv_.notify_all();
  RunShare(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    RunShare(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace moetier
