// Pipeline parallelism (docs/parallelism.md): the layers split into stages, one per rank of a
// group, each holding only its layers' weights and KV. Stage 0 (which runs the scheduler) embeds
// the tokens; each stage runs its layers and hands the hidden rows on; the last one computes the
// logits and sends them back to stage 0. A step's tokens are cut into micro-batches so that
// stage s works on micro-batch m while stage s + 1 works on m - 1. The group's transport (MPI)
// lives in the parallel module.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "model/model_weights.h"

namespace inferd {

// Point-to-point messages between the stages of one group.
class PipelineGroup {
 public:
  virtual ~PipelineGroup() = default;
  virtual int stage() const = 0;
  virtual int stages() const = 0;
  // Starts sending `data` to stage `to`, tagged; `data` must stay untouched until finish_sends().
  virtual Status send(int to, int tag, std::span<const float> data) = 0;
  // Receives exactly data.size() floats sent to this stage by `from` with `tag`.
  virtual Status receive(int from, int tag, std::span<float> data) = 0;
  // Waits until every send started since the last call has left.
  virtual Status finish_sends() = 0;
};

// Layers [layer_begin, layer_end) of stage `stage` of `stages`: contiguous, at least one each,
// balanced by the bytes each stage reads per token (the last stage's vocabulary projection
// counted with its layers; a MoE layer's experts with it). Errors: fewer layers than stages,
// weights already split. (A MoE model's dense and sparse layers were told apart at load time, by
// the whole model's index: each layer's weights say which it is.)
Expected<PipelineStage> plan_pipeline_stage(const ModelWeights& weights, int stage, int stages);

// Keeps only the stage's layers: config.num_layers becomes their count (so the stage's KV cache
// holds only them); weight_bytes counts what the stage reads (the embedding on stage 0, the
// vocabulary projection on the last).
Status pipeline_weights(ModelWeights& weights, const PipelineStage& stage);

// Token rows [begin, end) of each micro-batch of a step of `num_tokens`: at least
// `min_tokens` each (a decode step of a few sequences is one), at most `max_batches`.
struct MicroBatchPlan {
  int64_t count = 0;
  int64_t bounds[65] = {};  // micro-batch m is [bounds[m], bounds[m + 1])
};
MicroBatchPlan plan_micro_batches(int64_t num_tokens, int64_t min_tokens, int64_t max_batches);

}  // namespace inferd
