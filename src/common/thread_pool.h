// ThreadPool: a persistent pool of worker threads that kernels split their work over.
// Owned by the model runner; one parallel_for runs at a time (called from the engine thread).
// A decode step calls parallel_for a few hundred times, so hand-off must cost far less than a
// futex wake-up: workers spin on an atomic generation counter for a while after each job
// (about a millisecond) before they sleep on it (std::atomic::wait), and the caller spins on
// the count of joined workers the same way. No locks, no allocation per job.
//
// A job is a list of ranges that the caller and the workers take in turn from one counter.
// A worker joins a job when it wakes to it; once every range is taken the caller closes the
// job and waits only for the workers that joined. So a worker the host is not running (the
// machine is shared: other processes, the server's I/O threads) never holds the step up; the
// caller does its ranges itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace inferd {

// Rows of per-row work (a norm, a quantization, a rotation of one token) below which a job's
// hand-off costs more than splitting them saves: smaller batches (decode) run on the caller.
inline constexpr int64_t kPoolRows = 16;

class ThreadPool final {
 public:
  // Starts `num_threads - 1` workers; the calling thread is the last worker. num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Which thread of the job this thread is running: 0 for the thread that called parallel_for,
  // 1 .. num_threads - 1 for the workers (a pool's workers keep their index; any other thread is
  // 0). Ranges index per-thread scratch with it (PerThread below), never a result: which thread
  // runs a range depends on timing.
  static int thread_index() { return t_index_; }

  // Calls fn(begin, end) over a static, contiguous split of [0, n) into at most num_threads
  // ranges and waits for all of them. The split depends only on n and num_threads, never on
  // timing; which thread runs a range does, so fn keeps any per-thread state (PerThread
  // scratch) out of its result. Not re-entrant; call from one thread at a time. Does not
  // allocate.
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    auto trampoline = [](void* ctx, int64_t begin, int64_t end) {
      (*static_cast<std::remove_reference_t<Fn>*>(ctx))(begin, end);
    };
    run(n, 0, trampoline, static_cast<void*>(&fn));
  }

  // Calls fn(begin, end) over the ranges [k * grain, (k + 1) * grain) of [0, n) (grain >= 1)
  // and waits for all of them: with several ranges per thread, a thread slowed by its
  // hyper-thread sibling or the host does fewer, and no thread waits at the end for more than
  // one range. As with parallel_for, the ranges do not depend on timing; which thread runs
  // each does. Does not allocate.
  template <typename Fn>
  void parallel_for_dynamic(int64_t n, int64_t grain, Fn&& fn) {
    auto trampoline = [](void* ctx, int64_t begin, int64_t end) {
      (*static_cast<std::remove_reference_t<Fn>*>(ctx))(begin, end);
    };
    run(n, grain, trampoline, static_cast<void*>(&fn));
  }

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t);
  void run(int64_t n, int64_t grain, Trampoline fn, void* ctx);
  void worker_loop(int index);
  void take_ranges();
  void run_range(int64_t r) const;

  static inline thread_local int t_index_ = 0;  // inline: every user sees its constant initializer

  int num_threads_;
  std::vector<std::thread> workers_;
  // Each on its own cache line: the workers spin reading generation_ while the threads that
  // run a job update active_ and next_.
  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped (release) to publish a job
  // Workers that joined the current job and have not finished it, plus kClosed (the top bit)
  // once the caller has closed it.
  alignas(64) std::atomic<uint32_t> active_{1u << 31};
  alignas(64) std::atomic<int64_t> next_{0};  // the first range of the current job nobody has taken
  std::atomic<bool> stopping_{false};
  // The job of the current generation (written before active_ opens it).
  alignas(64) Trampoline job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 0;  // 0: n split into job_ranges_ near-equal ranges; else ranges of grain
  int64_t job_ranges_ = 0;
};

// Scratch for each thread of a pool's jobs, kept by the thread that calls parallel_for and grown
// there before the job starts. Any thread may run any range (the host decides which ones run),
// so scratch a range grew on its own thread (thread_local) would be grown whenever a thread
// first gets a range of some shape, at any step; this is grown for every thread at once, by the
// caller, so a warm step allocates nothing whichever threads run it.
template <typename T>
class PerThread final {
 public:
  // One T for each thread of `pool`, each passed to grow(T&) (which resizes only what is short).
  template <typename Grow>
  void prepare(const ThreadPool& pool, Grow&& grow) {
    if (items_.size() < static_cast<size_t>(pool.num_threads()))
      items_.resize(static_cast<size_t>(pool.num_threads()));
    for (T& item : items_) grow(item);
  }
  // The calling thread's, inside a job of the pool given to prepare.
  T& mine() { return items_[static_cast<size_t>(ThreadPool::thread_index())]; }

 private:
  std::vector<T> items_;
};

// fn(begin, end) over the rows [0, n): split over `pool` (parallel_for) from kPoolRows rows on,
// else one call on the calling thread (also without a pool). For per-row work whose rows do not
// depend on each other.
template <typename Fn>
void for_rows(ThreadPool* pool, int64_t n, Fn&& fn) {
  if (pool != nullptr && n >= kPoolRows) {
    pool->parallel_for(n, fn);
  } else {
    fn(int64_t{0}, n);
  }
}

}  // namespace inferd
