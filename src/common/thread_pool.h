// ThreadPool: a persistent pool of worker threads that kernels split their work over.
// Owned by the model runner; one parallel_for runs at a time (called from the engine thread).
// A decode step calls parallel_for a few hundred times, so hand-off must cost far less than a
// futex wake-up: workers spin on an atomic generation counter for a while after each job
// (about a millisecond) before they sleep on it (std::atomic::wait), and the caller spins on
// the count of unfinished chunks the same way. No locks, no allocation per job.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace inferd {

class ThreadPool final {
 public:
  // Starts `num_threads - 1` workers; the calling thread is the last worker. num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over a static, contiguous split of [0, n) into at most num_threads
  // ranges and waits for all of them. The split depends only on n and num_threads, never on
  // timing. Not re-entrant; call from one thread at a time. Does not allocate.
  template <typename Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    auto trampoline = [](void* ctx, int64_t begin, int64_t end) {
      (*static_cast<std::remove_reference_t<Fn>*>(ctx))(begin, end);
    };
    run(n, trampoline, static_cast<void*>(&fn));
  }

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t);
  void run(int64_t n, Trampoline fn, void* ctx);
  void worker_loop(int index);
  void run_chunk(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};  // bumped (release) to publish a job
  std::atomic<int> pending_{0};          // workers that have not finished the current job
  std::atomic<bool> stopping_{false};
  // The job of the current generation (written before generation_ is bumped).
  Trampoline job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
};

}  // namespace inferd
