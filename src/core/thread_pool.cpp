#include "core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "core/tuning.h"

namespace moetier {

namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

int ReadIntFile(const std::string& path, int fallback) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return fallback;
  int v = fallback;
  if (std::fscanf(f, "%d", &v) != 1) v = fallback;
  std::fclose(f);
  return v;
}

// The CPUs this process may use, and one of them per physical core, read once: pools pin their
// workers, and a later pool must still see the process's whole mask.
struct CpuTopology {
  std::vector<int> logical;  // ascending
  std::vector<int> cores;    // the lowest logical CPU of each physical core, ascending

  static const CpuTopology& Get() {
    static const CpuTopology topo = Read();
    return topo;
  }

 private:
  static CpuTopology Read() {
    CpuTopology t;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) t.logical.push_back(c);
    }
    if (t.logical.empty()) {
      const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      for (int c = 0; c < n; ++c) t.logical.push_back(c);
    }
    // Unknown topology (files missing): every logical CPU counts as a core of its own.
    std::map<std::pair<int, int>, int> first_of_core;
    for (int c : t.logical) {
      const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
      const int package = ReadIntFile(dir + "physical_package_id", 0);
      const int core = ReadIntFile(dir + "core_id", -1 - c);
      first_of_core.emplace(std::make_pair(package, core), c);
    }
    for (const auto& [key, cpu] : first_of_core) t.cores.push_back(cpu);
    std::sort(t.cores.begin(), t.cores.end());
    return t;
  }
};

// True when the thread now runs on `cpu` only. Failure (a container that forbids it, a cgroup
// that changed the mask) only costs placement, never correctness.
bool PinThread(pthread_t thread, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(thread, sizeof set, &set) == 0;
}

}  // namespace

int ThreadPool::AvailableThreads() {
  return static_cast<int>(CpuTopology::Get().logical.size());
}

int ThreadPool::DefaultThreads() {
  return static_cast<int>(CpuTopology::Get().cores.size());
}

int ThreadPool::MaxThreads() {
  return kMaxThreadsPerCpu * std::max(1, AvailableThreads());
}

Status ThreadPool::CheckThreadCount(int64_t n_threads, std::string_view flag) {
  if (n_threads >= 0 && n_threads <= MaxThreads()) return OkStatus();
  return Status::Error(std::string(flag) + " " + std::to_string(n_threads) +
                       ": expected 0 (one thread per physical core, " +
                       std::to_string(DefaultThreads()) + " here) up to " +
                       std::to_string(MaxThreads()) + " (" + std::to_string(kMaxThreadsPerCpu) +
                       " per logical CPU this process may use)");
}

bool ThreadPool::PinThreads() {
  return Tuning().pin_threads.value_or(1) != 0;
}

int ThreadPool::SpinMicros() {
  return static_cast<int>(Tuning().spin_us.value_or(kDefaultSpinMicros));
}

ThreadPool::ThreadPool(int n_threads) : ThreadPool(n_threads, PinThreads()) {}

ThreadPool::ThreadPool(int n_threads, bool pin)
    : n_threads_(n_threads > 0 ? n_threads : DefaultThreads()), spin_us_(SpinMicros()) {
  const std::vector<int>& cores = CpuTopology::Get().cores;
  // Worker i takes core i; core 0 is left to the calling thread. More threads than cores:
  // nothing is pinned (two pinned threads on one core would be worse than the scheduler).
  pinned_ = pin && n_threads_ > 1 && n_threads_ <= static_cast<int>(cores.size());
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  bool all_pinned = pinned_;
  try {
    for (int i = 1; i < n_threads_; ++i) {
      workers_.emplace_back([this, i] { WorkerLoop(i); });
      // Pinned from here, before the worker takes any job, so pinned() is known on return.
      if (pinned_)
        all_pinned &= PinThread(workers_.back().native_handle(), cores[static_cast<size_t>(i)]);
    }
  } catch (...) {
    // The system refused a thread (CheckThreadCount keeps counts sane, but memory limits may
    // still): the workers already running are stopped and joined, so the exception that
    // propagates is a std::system_error the caller can report, not std::terminate.
    StopWorkers();
    throw;
  }
  pinned_ = all_pinned;
  if (pinned_) {
    worker_cpus_.assign(cores.begin() + 1, cores.begin() + n_threads_);
    std::sort(worker_cpus_.begin(), worker_cpus_.end());
  }
}

bool ThreadPool::IsWorkerCpu(int cpu) const {
  return std::binary_search(worker_cpus_.begin(), worker_cpus_.end(), cpu);
}

std::optional<cpu_set_t> ThreadPool::MoveCallerOffWorkers() const {
  if (!IsWorkerCpu(sched_getcpu())) return std::nullopt;  // a vDSO read, no system call
  cpu_set_t before;
  CPU_ZERO(&before);
  if (pthread_getaffinity_np(pthread_self(), sizeof before, &before) != 0) return std::nullopt;
  cpu_set_t allowed = before;
  for (int cpu : worker_cpus_) CPU_CLR(cpu, &allowed);
  // Core 0 is never a worker's, but the caller's own mask may exclude it: then it stays.
  if (CPU_COUNT(&allowed) == 0 ||
      pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0)
    return std::nullopt;
  return before;
}

ThreadPool::~ThreadPool() {
  StopWorkers();
}

void ThreadPool::StopWorkers() {
  stopping_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::Run(JobFn job) {
  const std::optional<cpu_set_t> caller_mask =
      pinned_ ? MoveCallerOffWorkers() : std::optional<cpu_set_t>();
  job_ = job;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  // seq_cst pairs with the worker's sleepers_ increment: either this load sees the sleeper, or
  // the sleeper's re-check of generation_ sees the new job (no lost wake-up).
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  job(*this, 0);
  if (pending_.load(std::memory_order_acquire) != 0) {
    const auto spin_until =
        std::chrono::steady_clock::now() + std::chrono::microseconds(spin_micros());
    uint32_t spins = 0;
    int left;
    while ((left = pending_.load(std::memory_order_acquire)) != 0) {
      CpuRelax();
      if ((++spins & 0xFF) == 0 && std::chrono::steady_clock::now() >= spin_until) {
        caller_sleeping_.store(true, std::memory_order_seq_cst);
        // seq_cst pairs with the last worker's decrement and flag load (see WorkerLoop).
        left = pending_.load(std::memory_order_seq_cst);
        if (left != 0) pending_.wait(left, std::memory_order_seq_cst);
        caller_sleeping_.store(false, std::memory_order_relaxed);
      }
    }
  }
  job_ = nullptr;
  if (caller_mask) pthread_setaffinity_np(pthread_self(), sizeof *caller_mask, &*caller_mask);
}

void ThreadPool::WorkerLoop(int index) {
  // The generation at construction, not now: a job may already have been issued before this
  // thread got here, and it must run it.
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto spin_until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(spin_micros());
      uint32_t spins = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        CpuRelax();
        if ((++spins & 0xFF) == 0 && std::chrono::steady_clock::now() >= spin_until) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          generation_.wait(seen, std::memory_order_seq_cst);
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
        }
      }
    }
    seen = g;
    if (stopping_.load(std::memory_order_acquire)) return;
    job_(*this, index);
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst))
      pending_.notify_one();
  }
}

void ThreadPool::RangeJob(ThreadPool& pool, int index) {
  if (index >= pool.job_parts_) return;
  const size_t per = pool.job_n_ / static_cast<size_t>(pool.job_parts_);
  const size_t extra = pool.job_n_ % static_cast<size_t>(pool.job_parts_);
  const size_t i = static_cast<size_t>(index);
  const size_t begin = i * per + std::min(i, extra);
  const size_t end = begin + per + (i < extra ? 1 : 0);
  if (begin < end) (*pool.range_fn_)(begin, end, index);
}

void ThreadPool::TaskJob(ThreadPool& pool, int index) {
  for (;;) {
    const size_t task = pool.next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= pool.job_n_) return;
    (*pool.task_fn_)(task, index);
  }
}

void ThreadPool::ParallelFor(size_t n, RangeFn fn) {
  if (n == 0) return;
  const int parts = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(n_threads_)));
  if (parts == 1) {
    fn(0, n, 0);
    return;
  }
  range_fn_ = &fn;
  job_n_ = n;
  job_parts_ = parts;
  Run(&ThreadPool::RangeJob);
  range_fn_ = nullptr;
}

void ThreadPool::ParallelTasks(size_t n_tasks, TaskFn fn) {
  if (n_tasks == 0) return;
  if (n_tasks == 1 || n_threads_ == 1) {
    for (size_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  task_fn_ = &fn;
  job_n_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  Run(&ThreadPool::TaskJob);
  task_fn_ = nullptr;
}

}  // namespace moetier
