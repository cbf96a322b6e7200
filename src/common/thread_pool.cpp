#include "common/thread_pool.h"

#include <algorithm>

#include "common/check.h"

namespace inferd {

namespace {

// Spin iterations before a waiter sleeps: a pause is ~40-140 cycles, so this is roughly a
// millisecond, longer than the gap between two parallel_for calls of one step.
constexpr int kSpinLimit = 1 << 14;

// active_'s top bit: the job is closed, and no worker may join it any more.
constexpr uint32_t kClosed = 1u << 31;

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

void ThreadPool::run_range(int64_t r) const {
  int64_t begin = 0, end = 0;
  if (job_grain_ == 0) {
    begin = job_n_ * r / job_ranges_;
    end = job_n_ * (r + 1) / job_ranges_;
  } else {
    begin = r * job_grain_;
    end = std::min(job_n_, begin + job_grain_);
  }
  if (begin < end) job_fn_(job_ctx_, begin, end);
}

void ThreadPool::take_ranges() {
  for (int64_t r = next_.fetch_add(1, std::memory_order_relaxed); r < job_ranges_;
       r = next_.fetch_add(1, std::memory_order_relaxed))
    run_range(r);
}

void ThreadPool::run(int64_t n, int64_t grain, Trampoline fn, void* ctx) {
  INFERD_CHECK(grain >= 0);
  if (n <= 0) return;
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_n_ = n;
  job_grain_ = grain;
  job_ranges_ = grain == 0 ? std::min<int64_t>(n, num_threads_) : (n + grain - 1) / grain;
  // The caller is thread 0 of its job, even if it is a worker of another pool.
  struct CallerIndex {
    int saved = t_index_;
    CallerIndex() { t_index_ = 0; }
    ~CallerIndex() { t_index_ = saved; }
  } caller_index;
  if (num_threads_ == 1 || job_ranges_ == 1) {
    for (int64_t r = 0; r < job_ranges_; ++r) run_range(r);
    return;
  }
  next_.store(0, std::memory_order_relaxed);
  active_.store(0, std::memory_order_release);  // opens the job: workers may join
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  take_ranges();
  // Every range is taken. Close the job, so that a worker the host has not run since it was
  // published does not join it late, and wait only for the workers that joined: the caller
  // never waits for a thread that is not running.
  uint32_t active = active_.fetch_or(kClosed, std::memory_order_acq_rel) | kClosed;
  int spins = 0;
  while (active != kClosed) {
    if (++spins < kSpinLimit) {
      cpu_relax();
    } else {
      active_.wait(active, std::memory_order_acquire);
    }
    active = active_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(int index) {
  t_index_ = index;
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
    // Join the open job, if it is still open. It may be a later job than the generation seen:
    // joining reads the job's fields after the caller published them (acquire on active_).
    uint32_t active = active_.load(std::memory_order_relaxed);
    bool joined = false;
    while ((active & kClosed) == 0 && !joined)
      joined = active_.compare_exchange_weak(active, active + 1, std::memory_order_acquire,
                                             std::memory_order_relaxed);
    if (!joined) continue;
    take_ranges();
    if (active_.fetch_sub(1, std::memory_order_release) == kClosed + 1) active_.notify_one();
  }
}

}  // namespace inferd
