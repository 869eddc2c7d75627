// A fixed pool of worker threads, created once and reused for every parallel loop, so the
// decode loop never creates a thread, takes a lock or allocates. The calling thread works too:
// a pool of N threads runs N-1 workers plus the caller.
//
// Hand-off: between jobs a worker spins on an atomic job counter for up to SpinMicros() (a
// decode step issues a few dozen jobs a few microseconds apart; waking a sleeping thread through
// the kernel costs 40-100 µs each time, which measured as the largest cost of a small model's
// step), then sleeps on a futex until the next job. The caller waits for the workers the same
// way. Both bounds matter when the machine has fewer free cores than the pool has threads
// (another program, parallel test processes): a spinner then takes the core from the thread it
// waits for, and only the sleep ends that.
//
// Placement: with PinThreads() (default on), worker i runs on physical core i of the cores this
// process may use (one logical CPU per core), so every worker streams its weight bytes from its
// own core and hyper-threads never pair up on one core's load ports. The calling thread is not
// pinned (it belongs to the application), but a job that finds it on a worker's CPU (the
// scheduler moves it there while the workers sleep) narrows its affinity to the CPUs no worker
// uses for the job's length. Otherwise the caller, spinning for the workers, would hold the core
// of the very worker it waits for until the scheduler's time slice ends (milliseconds, for a
// job of tens of µs).
//
// Contract: ParallelFor/ParallelTasks are called from one thread at a time (the engine thread);
// they return after every piece has run. Which thread runs a piece may vary, so callers make
// every output element depend on its piece only: results never depend on timing.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "core/function_ref.h"
#include "core/status.h"

namespace moetier {

class ThreadPool {
 public:
  // n_threads <= 0 means DefaultThreads().
  explicit ThreadPool(int n_threads = 0);
  ThreadPool(int n_threads, bool pin);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Whether every worker runs on its own physical core (false if pinning was off or refused).
  bool pinned() const { return pinned_; }
  // Whether `cpu` is a logical CPU a worker is pinned to (Placement, above).
  bool IsWorkerCpu(int cpu) const;
  // How long a thread spins for the next job (or for the workers) before it sleeps, µs:
  // SpinMicros() unless set. A user whose jobs come further apart than that, but whose cost
  // matters once they come, sets it longer: waking a sleeping thread can cost far more than
  // the job (Hand-off, above).
  int spin_micros() const { return spin_us_.load(std::memory_order_relaxed); }
  void set_spin_micros(int us) { spin_us_.store(us, std::memory_order_relaxed); }

  // Calls fn(begin, end, thread_index) over a partition of [0, n) into at most size() contiguous
  // ranges, range i on thread i (static: for work of uniform cost).
  using RangeFn = FunctionRef<void(size_t begin, size_t end, int thread_index)>;
  void ParallelFor(size_t n, RangeFn fn);

  // Calls fn(task, thread_index) once for every task in [0, n_tasks); threads take the next task
  // from a shared counter as they finish one (dynamic: for pieces of uneven cost, and so that a
  // thread slowed by the OS does not hold the others back).
  using TaskFn = FunctionRef<void(size_t task, int thread_index)>;
  void ParallelTasks(size_t n_tasks, TaskFn fn);

  // Logical CPUs this process may run on (affinity mask at first use).
  static int AvailableThreads();
  // Physical cores among them: the default thread count. Memory-bound loops gain nothing from a
  // core's second hyper-thread, and two threads on one core halve each other's compute.
  static int DefaultThreads();

  // The most threads a user may ask for: kMaxThreadsPerCpu per logical CPU. Past the CPUs,
  // threads only time-slice the same cores (tests use a few more to check that results do not
  // depend on the count); far past them, creating the threads fails.
  static constexpr int kMaxThreadsPerCpu = 8;
  static int MaxThreads();
  // OK for 0 (the default) and 1..MaxThreads(); otherwise an error naming `flag`.
  static Status CheckThreadCount(int64_t n_threads, std::string_view flag);

  // Heuristics with their overrides (core/tuning.h, read once per pool):
  //   MOETIER_PIN_THREADS=0 leaves workers to the scheduler (default: pinned when the pool has no
  //   more threads than physical cores).
  //   MOETIER_SPIN_US=N spins N µs before sleeping (default kDefaultSpinMicros; 0: sleep at once).
  static constexpr int kDefaultSpinMicros = 200;
  static bool PinThreads();
  static int SpinMicros();

 private:
  using JobFn = void (*)(ThreadPool& pool, int thread_index);
  void Run(JobFn job);  // runs job on every thread (the caller is thread 0) and waits
  void WorkerLoop(int index);
  void StopWorkers();  // wakes every worker to exit and joins it
  // When the caller runs on a worker's CPU: moves it off the workers' CPUs and returns its
  // affinity mask as it was, for Run to put back (Placement, above).
  std::optional<cpu_set_t> MoveCallerOffWorkers() const;
  static void RangeJob(ThreadPool& pool, int thread_index);
  static void TaskJob(ThreadPool& pool, int thread_index);

  int n_threads_;
  bool pinned_ = false;
  std::vector<int> worker_cpus_;  // ascending; empty unless pinned_
  std::atomic<int> spin_us_;
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> generation_{0};       // bumped per job; workers wait for it to change
  std::atomic<int> sleepers_{0};              // workers blocked in generation_.wait
  std::atomic<int> pending_{0};               // workers still running the current job
  std::atomic<bool> caller_sleeping_{false};  // the caller blocked in pending_.wait
  std::atomic<bool> stopping_{false};
  // The current job, written before generation_ is bumped (release) and read after (acquire).
  JobFn job_ = nullptr;
  const RangeFn* range_fn_ = nullptr;
  const TaskFn* task_fn_ = nullptr;
  size_t job_n_ = 0;
  int job_parts_ = 0;
  std::atomic<size_t> next_task_{0};
};

}  // namespace moetier
