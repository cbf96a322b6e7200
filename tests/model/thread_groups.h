// The parallel groups of tensor_parallel_test and pipeline_parallel_test: ranks and stages as
// threads of one process joined in memory, so the split math is tested without MPI.
#pragma once

#include <barrier>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "model/pipeline_parallel.h"
#include "model/tensor_parallel.h"

namespace inferd::test {

// The ranks of one group, as threads: every collective meets at a barrier and sums in rank order.
struct SharedGroup {
  explicit SharedGroup(int size) : size(size), barrier(size), data(static_cast<size_t>(size)) {}
  int size;
  std::barrier<> barrier;
  std::vector<std::span<const float>> data;
};

class ThreadGroup final : public TensorParallelGroup {
 public:
  ThreadGroup(SharedGroup& shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_.size; }
  Status all_reduce_sum(std::span<float> data) override {
    shared_.data[static_cast<size_t>(rank_)] = data;
    shared_.barrier.arrive_and_wait();
    sum_.assign(data.size(), 0.0f);
    for (const auto& d : shared_.data) {
      if (d.size() != data.size()) return invalid_argument("all-reduce sizes differ");
      for (size_t i = 0; i < d.size(); ++i) sum_[i] += d[i];
    }
    shared_.barrier.arrive_and_wait();
    std::copy(sum_.begin(), sum_.end(), data.begin());
    return Status::ok();
  }
  Status gather(std::span<const float> local, std::span<const int64_t> counts,
                std::span<float> all) override {
    if (static_cast<int64_t>(local.size()) != counts[static_cast<size_t>(rank_)])
      return invalid_argument("gather count differs");
    shared_.data[static_cast<size_t>(rank_)] = local;
    shared_.barrier.arrive_and_wait();
    if (rank_ == 0) {
      size_t at = 0;
      for (const auto& d : shared_.data)
        at = static_cast<size_t>(
            std::copy(d.begin(), d.end(), all.begin() + static_cast<std::ptrdiff_t>(at)) - all.begin());
    }
    shared_.barrier.arrive_and_wait();
    return Status::ok();
  }

 private:
  SharedGroup& shared_;
  int rank_;
  std::vector<float> sum_;
};

// The stages of one pipeline, as threads: a message waits in a mailbox until its receiver takes it.
struct Mailboxes {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::vector<std::vector<float>>> boxes;  // (from, to, tag)
};

class ThreadPipeline final : public PipelineGroup {
 public:
  ThreadPipeline(Mailboxes& m, int stage, int stages) : m_(m), stage_(stage), stages_(stages) {}
  int stage() const override { return stage_; }
  int stages() const override { return stages_; }
  Status send(int to, int tag, std::span<const float> data) override {
    std::lock_guard<std::mutex> lock(m_.mutex);
    m_.boxes[{stage_, to, tag}].emplace_back(data.begin(), data.end());
    m_.cv.notify_all();
    return Status::ok();
  }
  Status receive(int from, int tag, std::span<float> data) override {
    std::unique_lock<std::mutex> lock(m_.mutex);
    auto& box = m_.boxes[{from, stage_, tag}];
    if (!m_.cv.wait_for(lock, std::chrono::seconds(30), [&] { return !box.empty(); }))
      return Status(StatusCode::kInternal, "receive timed out");
    std::vector<float> got = std::move(box.front());
    box.erase(box.begin());
    if (got.size() != data.size()) return invalid_argument("message size differs");
    std::copy(got.begin(), got.end(), data.begin());
    return Status::ok();
  }
  Status finish_sends() override { return Status::ok(); }

 private:
  Mailboxes& m_;
  int stage_, stages_;
};

}  // namespace inferd::test
