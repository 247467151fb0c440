#include "paternoster/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace paternoster {
namespace {

TEST(ThreadPool, RunsEveryItemOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, ManySmallJobsBackToBack) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 2000; ++job) {
    pool.parallel_for(3, [&](int64_t i) { sum += i; });
  }
  EXPECT_EQ(sum.load(), 2000 * 3);
}

TEST(ThreadPool, RethrowsTheFirstException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](int64_t i) {
                                   if (i == 37) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  // Still usable afterwards.
  std::atomic<int> count{0};
  pool.parallel_for(10, [&](int64_t) { count++; });
  EXPECT_EQ(count.load(), 10);
}

TEST(ThreadPool, ChangingTheThreadCount) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  pool.set_num_threads(3);
  std::atomic<int> count{0};
  pool.parallel_for(50, [&](int64_t) { count++; });
  pool.set_num_threads(2);
  pool.parallel_for(50, [&](int64_t) { count++; });
  EXPECT_EQ(count.load(), 100);
  EXPECT_THROW(pool.set_num_threads(0), std::invalid_argument);
}

}  // namespace
}  // namespace paternoster
