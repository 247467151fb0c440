#include "paternoster/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace paternoster {

namespace {
long current_pid() { return static_cast<long>(::getpid()); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls `ready` for up to ThreadPool::spin_micros(); true once it holds.
template <typename Ready>
bool spin_until(const Ready& ready) {
  const int micros = ThreadPool::spin_micros();
  if (micros <= 0) return ready();
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > end) return ready();
  }
}
}  // namespace

namespace {
int initial_spin_micros() {
  const char* env = std::getenv("PATERNOSTER_SPIN_US");
  if (!env || !*env) return ThreadPool::kDefaultSpinMicros;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  return (*end == '\0' && v >= 0 && v <= 1000000) ? static_cast<int>(v)
                                                  : ThreadPool::kDefaultSpinMicros;
}
std::atomic<int> g_spin_micros{initial_spin_micros()};
}  // namespace

int ThreadPool::spin_micros() { return g_spin_micros.load(std::memory_order_relaxed); }

void ThreadPool::set_spin_micros(int micros) {
  if (micros < 0) throw std::invalid_argument("spin micros must be >= 0");
  g_spin_micros.store(micros, std::memory_order_relaxed);
}

void set_spin_micros(int micros) { ThreadPool::set_spin_micros(micros); }
int get_spin_micros() { return ThreadPool::spin_micros(); }

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(1), owner_pid_(current_pid()), shared_(new Shared) {
  set_num_threads(num_threads);
}

ThreadPool::~ThreadPool() {
  if (owner_pid_.load() != current_pid()) return;  // forked child: leak
  {
    std::lock_guard<std::mutex> call(shared_->call_mu);
    stop_workers();
  }
  delete shared_;
}

void ThreadPool::set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("num_threads must be >= 1, got " + std::to_string(n));
  num_threads_.store(n);
}

void ThreadPool::reset_after_fork() {
  // The parent's worker threads and any lock state do not exist here: leak
  // the handles (a joinable std::thread can be neither joined nor destroyed)
  // and the shared state, and start over.
  new std::vector<std::thread>(std::move(workers_));
  workers_.clear();
  shared_ = new Shared;
  owner_pid_.store(current_pid());
}

void ThreadPool::start_workers(int n) {
  shared_->stopping = false;
  workers_.reserve(static_cast<size_t>(n));
  Shared* sh = shared_;
  for (int i = 0; i < n; ++i) workers_.emplace_back([sh] { worker_loop(sh); });
}

void ThreadPool::stop_workers() {
  if (workers_.empty()) return;
  {
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->stopping = true;
  }
  shared_->wake.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
  shared_->stopping = false;
}

void ThreadPool::run_items(Shared* sh, const std::function<void(int64_t)>& fn, int64_t n) {
  while (!sh->failed.load(std::memory_order_relaxed)) {
    const int64_t i = sh->next_item.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) break;
    try {
      fn(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(sh->mu);
      if (!sh->failed.exchange(true)) sh->error = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(Shared* sh) {
  uint64_t seen = 0;
  {
    std::lock_guard<std::mutex> lk(sh->mu);
    seen = sh->generation;
  }
  for (;;) {
    const std::function<void(int64_t)>* fn = nullptr;
    int64_t n = 0;
    spin_until([&] { return sh->posted.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lk(sh->mu);
      sh->wake.wait(lk, [&] { return sh->stopping || sh->generation != seen; });
      if (sh->stopping) return;
      seen = sh->generation;
      if (!sh->job_open) continue;  // woke too late: the caller finished alone
      ++sh->active;
      sh->running.store(sh->active, std::memory_order_release);
      fn = sh->fn;
      n = sh->num_items;
    }
    run_items(sh, *fn, n);
    {
      std::lock_guard<std::mutex> lk(sh->mu);
      sh->running.store(--sh->active, std::memory_order_release);
      if (sh->active == 0) sh->idle.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int threads = num_threads_.load();
  if (threads == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (owner_pid_.load() != current_pid()) reset_after_fork();
  Shared* sh = shared_;
  std::lock_guard<std::mutex> call(sh->call_mu);
  const int want = threads - 1;
  if (static_cast<int>(workers_.size()) != want) {
    stop_workers();
    start_workers(want);
  }
  {
    std::lock_guard<std::mutex> lk(sh->mu);
    sh->fn = &fn;
    sh->num_items = n;
    sh->next_item.store(0);
    sh->failed.store(false);
    sh->error = nullptr;
    sh->job_open = true;
    ++sh->generation;
    sh->posted.store(sh->generation, std::memory_order_release);
  }
  sh->wake.notify_all();
  run_items(sh, fn, n);
  std::exception_ptr err;
  spin_until([&] { return sh->running.load(std::memory_order_acquire) == 0; });
  {
    // Every item is claimed; wait for the workers still running one.
    std::unique_lock<std::mutex> lk(sh->mu);
    sh->idle.wait(lk, [&] { return sh->active == 0; });
    sh->job_open = false;
    sh->fn = nullptr;
    err = sh->error;
    sh->error = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

ThreadPool& default_thread_pool() {
  // Leaked on purpose: joining threads during static destruction at interpreter
  // exit can deadlock.
  static ThreadPool* pool = new ThreadPool(1);
  return *pool;
}

void set_num_threads(int n) { default_thread_pool().set_num_threads(n); }
int get_num_threads() { return default_thread_pool().num_threads(); }

}  // namespace paternoster
