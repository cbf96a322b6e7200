#include "common/thread_pool.h"

#include <algorithm>

#include "common/check.h"

namespace inferd {

namespace {

// Spin iterations before a waiter sleeps: a pause is ~40-140 cycles, so this is roughly a
// millisecond, longer than the gap between two parallel_for calls of one step.
constexpr int kSpinLimit = 1 << 14;

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  INFERD_CHECK(num_threads >= 1);
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  if (index >= job_chunks_) return;
  int64_t begin = job_n_ * index / job_chunks_;
  int64_t end = job_n_ * (index + 1) / job_chunks_;
  if (begin < end) job_fn_(job_ctx_, begin, end);
}

void ThreadPool::run(int64_t n, Trampoline fn, void* ctx) {
  if (n <= 0) return;
  int chunks = static_cast<int>(std::min<int64_t>(n, num_threads_));
  if (chunks == 1) {
    fn(ctx, 0, n);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_n_ = n;
  job_chunks_ = chunks;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_chunk(0);
  int spins = 0;
  for (int left = pending_.load(std::memory_order_acquire); left != 0;
       left = pending_.load(std::memory_order_acquire)) {
    if (++spins < kSpinLimit) {
      cpu_relax();
    } else {
      pending_.wait(left, std::memory_order_acquire);
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t now = generation_.load(std::memory_order_acquire);
    while (now == seen) {
      if (++spins < kSpinLimit) {
        cpu_relax();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stopping_.load(std::memory_order_acquire)) return;
    run_chunk(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace inferd
