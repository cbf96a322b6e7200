// MaskPrefetcher: fills the grammar masks of a step's constrained rows on a thread of its own
// while the forward pass runs, so the step waits only for what is left of them once its logits
// are ready, and unconstrained rows are not held up by a grammar's trie walks. The engine starts
// it after scheduling and waits for it before sampling; the samplers it was given are not
// touched by anyone else in between.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/sampler.h"

namespace inferd {

class MaskPrefetcher final {
 public:
  MaskPrefetcher() = default;
  ~MaskPrefetcher();
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;

  // Starts Sampler::prepare_grammar_mask(num_logits) on each of `samplers` (swapped out: the
  // caller gets the previous batch's vector back to reuse). The thread starts on first use.
  void start(std::vector<Sampler*>* samplers, size_t num_logits);
  // Returns once every sampler of the last start() has its mask.
  void wait();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Sampler*> jobs_;
  size_t num_logits_ = 0;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace inferd
