// ModelRunner: turns the scheduler's plan into the transformer's flattened batch (token ids,
// positions, KV slots, block tables) and runs it. Knows no request policy. Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/scheduler.h"
#include "engine/step_mirror.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "model/transformer.h"

namespace inferd {

class ModelRunner final {
 public:
  // All not owned.
  ModelRunner(Transformer& model, KvCache& cache, const KVCacheManager& kv);

  // Runs one step. On success `sample_items` lists the indices of batch items that reached the
  // end of their tokens and `logits_row(i)` holds the vocab logits of each, in that order; an
  // item with drafts has 1 + drafts rows (`logits_row(i, j)`: after its j-th computed token of
  // the step, the row that predicts draft j, the last one the token after every draft).
  Status execute(const ScheduledBatch& batch);
  std::span<const int32_t> sample_items() const { return sample_items_; }
  std::span<const float> logits_row(size_t i, size_t j = 0) const;
  // Batch items that owe prompt logprobs: the prompt tokens [first_token, first_token + count)
  // whose log-probabilities this step's rows give (`prompt_row(k, j)`: the row of token
  // first_token + j, computed at the position before it).
  struct PromptRows {
    int32_t item;
    int64_t first_token;
    int64_t count;
    int32_t first_row;
  };
  std::span<const PromptRows> prompt_rows() const { return prompt_rows_; }
  std::span<const float> prompt_row(size_t k, size_t j) const;
  // Embedding requests' rows this step (Request::pooling): the final hidden states of their
  // prompt positions [first_position, first_position + count) (`hidden_row(k, j)`: position
  // first_position + j), the positions the pooling reads: the last (when computed this step),
  // every one (mean) or the first (cls); count 0 for a step that ends it and has none of them.
  // An embedding request's rows are never sample rows.
  struct PoolRows {
    int32_t item;
    int64_t first_position;
    int64_t count;
    int32_t first_row;
  };
  std::span<const PoolRows> pool_rows() const { return pool_rows_; }
  std::span<const float> hidden_row(size_t k, size_t j) const;
  // Copies KV block src to dst (a forked sample's copy of its prompt's last block), on every rank.
  Status copy_block(int32_t src, int32_t dst);

  // The other ranks of a tensor-parallel group (not owned; nullptr: none).
  void set_mirror(StepMirror* mirror) { mirror_ = mirror; }

 private:
  Transformer& model_;
  KvCache& cache_;
  const KVCacheManager& kv_;
  StepMirror* mirror_ = nullptr;
  // Reused across steps: no allocation once the largest batch has been seen.
  std::vector<int32_t> ids_, positions_, token_sequence_, logit_rows_, sample_items_, sample_first_row_,
      hidden_rows_;
  std::vector<int64_t> slots_;
  std::vector<AttentionSequence> sequences_;
  std::vector<const LoraAdapter*> sequence_lora_;  // [sequences] each one's adapter (null: the base)
  std::vector<float> logits_;
  std::vector<PromptRows> prompt_rows_;
  std::vector<float> hidden_;  // [hidden_rows_, hidden_size]
  std::vector<PoolRows> pool_rows_;
};

}  // namespace inferd
