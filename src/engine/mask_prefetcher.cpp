#include "engine/mask_prefetcher.h"

#include <utility>

namespace inferd {

MaskPrefetcher::~MaskPrefetcher() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MaskPrefetcher::start(std::vector<Sampler*>* samplers, size_t num_logits) {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.swap(*samplers);
    num_logits_ = num_logits;
    busy_ = true;
  }
  cv_.notify_all();
}

void MaskPrefetcher::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !busy_; });
}

void MaskPrefetcher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return busy_ || stop_; });
    if (stop_) return;
    lock.unlock();
    for (Sampler* s : jobs_) s->prepare_grammar_mask(num_logits_);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace inferd
