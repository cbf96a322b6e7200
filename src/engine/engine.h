// Engine: the step loop of continuous batching — schedule → execute → sample → update → emit.
// This class is the synchronous core driven by one thread (tests, offline batch); the threaded
// front end with submit/abort queues wraps it. Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "model/transformer.h"

namespace inferd {

struct EngineOptions {
  SchedulerOptions scheduler;
  int32_t block_size = 16;
  int64_t num_kv_blocks = 256;
  KvDType kv_dtype = KvDType::kF16;  // K/V storage; attention math is f32

  Status validate() const;
};

// What one step produced for one request.
struct StepOutput {
  RequestId id = 0;
  std::vector<int32_t> new_tokens;
  std::vector<float> logprobs;  // one per new token when the request asked for logprobs
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;
};

// Where the engine thread's time went (seconds, summed over steps).
struct EngineStats {
  int64_t steps = 0;
  int64_t tokens = 0;           // tokens computed
  double schedule_seconds = 0;  // schedule + update + finishing: the bookkeeping
  double execute_seconds = 0;   // the forward pass
  double sample_seconds = 0;
  double total_seconds() const { return schedule_seconds + execute_seconds + sample_seconds; }
};

struct RequestSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  GenerationLimits limits;
  int32_t priority = 0;
};

class Engine final {
 public:
  // model: not owned. Allocates the KV cache once, here.
  Engine(Transformer& model, const EngineOptions& options);

  // Queues a request; it joins at the next step. Returns its id (`id` when given: callers that
  // hand out ids themselves must keep them unique).
  RequestId add(RequestSpec spec, std::optional<RequestId> id = std::nullopt);
  // Ends a request now and frees its blocks.
  void abort(RequestId id);
  // Runs one step (nothing when idle) and returns the outputs of the requests it touched.
  std::vector<StepOutput> step();

  bool has_work() const { return scheduler_.has_work(); }
  const Scheduler& scheduler() const { return scheduler_; }
  const BlockPool& block_pool() const { return pool_; }
  const EngineStats& stats() const { return stats_; }
  int64_t max_tokens_in_cache() const {
    return pool_.num_blocks() * static_cast<int64_t>(options_.block_size);
  }

 private:
  void collect_finished(std::vector<StepOutput>* out);

  EngineOptions options_;
  Transformer& model_;
  KvCache cache_;
  BlockPool pool_;
  KVCacheManager kv_;
  Scheduler scheduler_;
  ModelRunner runner_;
  std::unordered_map<RequestId, Sampler> samplers_;
  RequestId next_id_ = 1;
  uint64_t next_arrival_ = 0;
  std::vector<int32_t> sampled_;
  EngineStats stats_;
};

}  // namespace inferd
