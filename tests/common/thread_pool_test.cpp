#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace inferd {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
}

TEST(ThreadPoolTest, DynamicRangesCoverEveryIndexOnceWithinTheGrain) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int64_t> ranges{0};
        std::atomic<bool> too_long{false};
        pool.parallel_for_dynamic(n, grain, [&](int64_t b, int64_t e) {
          if (e - b > grain || b >= e) too_long = true;
          ++ranges;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (auto& h : hits)
          EXPECT_EQ(h.load(), 1) << "threads=" << threads << " n=" << n << " grain=" << grain;
        EXPECT_FALSE(too_long.load()) << "threads=" << threads << " n=" << n << " grain=" << grain;
        EXPECT_EQ(ranges.load(), (n + grain - 1) / grain) << "threads=" << threads << " n=" << n;
      }
    }
  }
}

TEST(ThreadPoolTest, DynamicRangesGoToTheThreadThatIsFree) {
  // One range holds its thread until every other range is done: the other ranges must all be
  // taken by the remaining threads, not split up front between the two.
  ThreadPool pool(2);
  constexpr int64_t kN = 64;
  std::atomic<int64_t> done{0};
  std::atomic<bool> timed_out{false};
  pool.parallel_for_dynamic(kN, 1, [&](int64_t b, int64_t) {
    if (b == 0) {
      auto start = std::chrono::steady_clock::now();
      while (done.load() < kN - 1) {
        if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
          timed_out = true;
          break;
        }
        std::this_thread::yield();
      }
    }
    ++done;
  });
  EXPECT_FALSE(timed_out.load());
  EXPECT_EQ(done.load(), kN);
}

TEST(ThreadPoolTest, MoreThreadsThanCoresLoseNoRangeAndRunNoneTwice) {
  // Sixteen threads on this machine's few cores: workers wake late, to a job already closed or
  // to a later job than the one they were woken for. Every job must still run each of its
  // ranges exactly once, and nothing may run after the call returns.
  ThreadPool pool(16);
  std::vector<std::atomic<int>> hits(97);
  std::atomic<bool> inside{false}, late{false};
  std::atomic<int64_t> by_workers{0};
  const auto caller = std::this_thread::get_id();
  for (int job = 0; job < 3000; ++job) {
    const int64_t n = 1 + job % 97;
    for (int64_t i = 0; i < n; ++i) hits[static_cast<size_t>(i)] = 0;
    inside = true;
    auto fn = [&](int64_t b, int64_t e) {
      if (!inside.load()) late = true;
      if (std::this_thread::get_id() != caller) ++by_workers;
      for (int64_t i = b; i < e; ++i) {
        hits[static_cast<size_t>(i)]++;
        volatile int sink = 0;
        for (int k = 0; k < 300; ++k) sink = sink + k;
      }
    };
    if (job % 2 == 0) {
      pool.parallel_for(n, fn);
    } else {
      pool.parallel_for_dynamic(n, 1 + job % 5, fn);
    }
    inside = false;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "job " << job << " i " << i;
  }
  EXPECT_FALSE(late.load());
  EXPECT_GT(by_workers.load(), 0) << "no worker ever joined: the test did not test joining";
}

TEST(ThreadPoolTest, ThreadIndexNamesOneRunningThreadOfTheJob) {
  // Ranges running at once never share an index, every index is below the thread count, and the
  // caller's ranges are thread 0: per-thread scratch indexed by it is never used twice at once.
  ThreadPool pool(4);
  std::vector<std::atomic<int>> busy(4);
  std::atomic<bool> shared{false}, out_of_range{false}, caller_not_zero{false};
  const auto caller = std::this_thread::get_id();
  for (int job = 0; job < 2000; ++job) {
    auto fn = [&](int64_t, int64_t) {
      const int i = ThreadPool::thread_index();
      if (i < 0 || i >= 4) {
        out_of_range = true;
        return;
      }
      if (std::this_thread::get_id() == caller && i != 0) caller_not_zero = true;
      if (busy[static_cast<size_t>(i)].exchange(1) != 0) shared = true;
      volatile int sink = 0;
      for (int k = 0; k < 200; ++k) sink = sink + k;
      busy[static_cast<size_t>(i)] = 0;
    };
    if (job % 2 == 0) {
      pool.parallel_for(1 + job % 7, fn);
    } else {
      pool.parallel_for_dynamic(1 + job % 31, 1 + job % 3, fn);
    }
  }
  EXPECT_FALSE(out_of_range.load());
  EXPECT_FALSE(shared.load());
  EXPECT_FALSE(caller_not_zero.load());
  EXPECT_EQ(ThreadPool::thread_index(), 0);
}

TEST(ThreadPoolTest, AWorkerCallingAnotherPoolIsThreadZeroOfThatJob) {
  ThreadPool outer(3), inner(2);
  std::mutex inner_calls;  // inner runs one job at a time: the outer workers take turns
  std::atomic<bool> wrong{false}, timed_out{false};
  std::atomic<int> calls{0};
  for (int job = 0; job < 20; ++job) {
    std::atomic<bool> worker_called{false};
    outer.parallel_for_dynamic(6, 1, [&](int64_t, int64_t) {
      const int mine = ThreadPool::thread_index();
      if (mine == 0) {
        // The outer caller holds its range until a worker has called the inner pool: otherwise,
        // on a loaded machine, it may run every range before any worker wakes.
        const auto start = std::chrono::steady_clock::now();
        while (!worker_called.load()) {
          if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
            timed_out = true;
            break;
          }
          std::this_thread::yield();
        }
        return;
      }
      const auto me = std::this_thread::get_id();
      std::lock_guard<std::mutex> lock(inner_calls);
      inner.parallel_for_dynamic(8, 1, [&](int64_t, int64_t) {
        if (std::this_thread::get_id() == me && ThreadPool::thread_index() != 0) wrong = true;
      });
      if (ThreadPool::thread_index() != mine) wrong = true;  // its own index again after
      ++calls;
      worker_called = true;
    });
  }
  EXPECT_FALSE(timed_out.load()) << "no outer worker joined a job within 30 s";
  EXPECT_GE(calls.load(), 20);
  EXPECT_FALSE(wrong.load());
}

TEST(ThreadPoolTest, PerThreadGrowsEveryThreadsScratchOnTheCaller) {
  ThreadPool pool(3);
  PerThread<std::vector<int>> scratch;
  scratch.prepare(pool, [](std::vector<int>& v) {
    if (v.size() < 100) v.resize(100);
  });
  std::atomic<bool> short_scratch{false};
  pool.parallel_for_dynamic(300, 1, [&](int64_t b, int64_t) {
    std::vector<int>& mine = scratch.mine();
    if (mine.size() < 100) short_scratch = true;
    mine[static_cast<size_t>(b % 100)] = static_cast<int>(b);
  });
  EXPECT_FALSE(short_scratch.load());
}

TEST(ThreadPoolTest, RepeatedRunsAreStable) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int r = 0; r < 2000; ++r) {
    pool.parallel_for(10, [&](int64_t b, int64_t e) { total += e - b; });
  }
  EXPECT_EQ(total.load(), 20000);
}

}  // namespace
}  // namespace inferd
