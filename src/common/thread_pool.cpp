#include "common/thread_pool.h"

#include "common/check.h"

namespace inferd {

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  INFERD_CHECK(num_threads >= 1);
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_fn_ = fn;
    job_ctx_ = ctx;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  run_chunk(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_chunk(index);
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last = --pending_ == 0;
    }
    if (last) done_cv_.notify_one();
  }
}

}  // namespace inferd
