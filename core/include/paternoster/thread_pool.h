// A small persistent thread pool for the CPU kernels.
//
// std::thread only (no OpenMP: torch ships its own OpenMP runtime and two
// runtimes on two cores fight). parallel_for hands out item indices through an
// atomic counter, so uneven items balance dynamically; the calling thread works
// too, so a pool of n threads starts n - 1 workers. The caller never waits for
// a worker that has not woken up yet: it returns once every item is done and
// no worker is inside the job. Between jobs a worker spins for kSpinMicros
// (a decode step's kernels come tens of microseconds apart: a futex wake-up
// per call cost more than the small matrices it split) and then sleeps on a
// condition variable, so an idle pool does not steal a core from torch. One parallel_for runs
// at a time (concurrent callers queue on a mutex). After fork() the child
// rebuilds its workers on first use.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace paternoster {

class ThreadPool {
 public:
  // How long a worker (and a caller waiting for workers) polls before it
  // blocks, in microseconds (0: never spins). Process-wide; starts at
  // $PATERNOSTER_SPIN_US if set, else kDefaultSpinMicros. A host sets it per
  // step: long when the step's work is all in these kernels (back-to-back
  // calls), short when torch's own threads need the cores in between.
  static constexpr int kDefaultSpinMicros = 30;
  static int spin_micros();
  static void set_spin_micros(int micros);  // std::invalid_argument if < 0

  explicit ThreadPool(int num_threads = 1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Total threads used by parallel_for, including the caller (>= 1, else
  // std::invalid_argument). Workers start lazily on the next parallel_for.
  void set_num_threads(int n);
  int num_threads() const { return num_threads_.load(); }

  // Calls fn(i) once for every i in [0, n), spread over the pool; returns when
  // all calls are done. If a call throws, the remaining items are skipped and
  // the first exception is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  // Everything the workers share. After fork() the child cannot reuse it (its
  // mutexes and condition variables may record threads that do not exist
  // there), so a fresh one replaces it and the old one is leaked.
  struct Shared {
    std::mutex call_mu;  // serialises parallel_for callers
    std::mutex mu;       // guards the fields below except the atomics
    std::condition_variable wake;
    std::condition_variable idle;
    bool stopping = false;
    uint64_t generation = 0;  // bumped for every job
    std::atomic<uint64_t> posted{0};  // = generation, read without the lock (spinning)
    std::atomic<int> running{0};      // = active, read without the lock (spinning)
    bool job_open = false;    // the current job may still have items
    int active = 0;           // workers inside the current job
    const std::function<void(int64_t)>* fn = nullptr;
    int64_t num_items = 0;
    std::atomic<int64_t> next_item{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
  };

  void reset_after_fork();
  void start_workers(int n);
  void stop_workers();
  static void worker_loop(Shared* sh);
  static void run_items(Shared* sh, const std::function<void(int64_t)>& fn, int64_t n);

  std::atomic<int> num_threads_;
  std::atomic<long> owner_pid_;
  Shared* shared_;  // owned; leaked in a forked child
  std::vector<std::thread> workers_;
};

// The process-wide pool used by the attention kernels.
ThreadPool& default_thread_pool();
// Sets / reads default_thread_pool()'s thread count (default 1).
void set_num_threads(int n);
int get_num_threads();
// ThreadPool::set_spin_micros / spin_micros.
void set_spin_micros(int micros);
int get_spin_micros();

}  // namespace paternoster
