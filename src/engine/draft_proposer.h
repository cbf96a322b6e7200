// Speculative decoding with a draft model (--speculative-config '{"method": "draft_model",
// "model": PATH}'): a smaller model of the target's vocabulary runs ahead of each speculating
// request and proposes its greedy continuation, which the target verifies in one step.
//
// The draft keeps its own paged KV cache (a pool of as many blocks as the target's, of its own,
// smaller, layers) with one sequence per target request: the request's prompt and output, then
// the drafts. Before each step the sequences catch up on the tokens the target accepted since
// (the computed draft tokens that the target kept stay; the rest are computed again over the
// same slots), then take k - 1 one-token steps, all speculating requests in one batch per step.
// Greedy drafts are point masses, so the engine's verification (sample each position, keep
// going while the sample is the draft) is speculative sampling's rejection rule exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "model/transformer.h"

namespace inferd {

class DraftProposer final {
 public:
  // draft: not owned; its vocabulary must be the target's (the engine checks the size).
  DraftProposer(Transformer& draft, int64_t num_blocks, int32_t block_size, KvDType dtype);

  // Fills in the drafts the scheduler reserved (items with num_draft_tokens > 0; their requests'
  // draft vectors hold placeholders). An item whose sequence finds no KV block, even after
  // sequences not in this batch gave theirs back, loses its drafts (the item shrinks to its one
  // token). Allocation-free once the largest batch has been seen, but for a new request's
  // sequence.
  void propose(ScheduledBatch* batch);

  // The request ended: its sequence's blocks go back to the pool.
  void release(RequestId id);

  int64_t num_sequences() const { return static_cast<int64_t>(sequences_.size()); }
  int64_t num_free_blocks() const { return pool_.num_free_blocks(); }
  int64_t forward_passes() const { return forward_passes_; }
  int64_t evictions() const { return evictions_; }  // idle sequences that gave their blocks back
  int64_t dropped() const { return dropped_; }      // items that lost their drafts for want of a block
  double seconds() const { return seconds_; }

  // Catch-up tokens one forward pass computes per sequence (a long prompt takes several).
  static constexpr int64_t kChunk = 512;

 private:
  struct Sequence {
    Request shadow;  // id, prompt and output (then drafts) of the target request; no draft vector
    int64_t last_step = 0;
  };
  Sequence& sequence_of(const Request& r);
  // Makes room for `tokens` tokens of seq, taking blocks from sequences idle in this step.
  bool allocate(Sequence& seq, int64_t tokens);

  Transformer& model_;
  KvCache cache_;
  BlockPool pool_;
  KVCacheManager kv_;
  ModelRunner runner_;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> sequences_;
  int64_t step_ = 0;
  int64_t forward_passes_ = 0;
  int64_t evictions_ = 0;
  int64_t dropped_ = 0;
  double seconds_ = 0;
  // Reused across steps.
  struct Work {
    ScheduledItem* item;
    Sequence* seq;
    int64_t produced;
  };
  std::vector<Work> work_;
  ScheduledBatch pass_;
  std::vector<size_t> pass_work_;  // [pass item] its index in work_
};

}  // namespace inferd
