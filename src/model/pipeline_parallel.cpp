#include "model/pipeline_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace inferd {
namespace {

size_t layer_bytes(const LayerWeights& l) {
  size_t bytes = 0;
  for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
    bytes += t->num_bytes;
  const MoeWeights& m = l.moe;
  for (const auto* experts : {&m.expert_gate, &m.expert_up, &m.expert_down})
    for (const TensorView& t : *experts) bytes += t.num_bytes;
  for (const TensorView* t : {&m.router, &m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_expert_gate})
    bytes += t->num_bytes;
  return bytes;
}

}  // namespace

Expected<PipelineStage> plan_pipeline_stage(const ModelWeights& w, int stage, int stages) {
  const auto layers = static_cast<int64_t>(w.layers.size());
  if (stages < 1 || stage < 0 || stage >= stages)
    return invalid_argument("pipeline parallel: stage " + std::to_string(stage) + " of " +
                            std::to_string(stages));
  if (w.stage.stages != 1) return invalid_argument("pipeline parallel: the weights are split already");
  if (layers < stages) {
    return invalid_argument("pipeline parallel: " + std::to_string(layers) + " layers cannot make " +
                            std::to_string(stages) + " stages");
  }
  // prefix[i]: bytes of layers [0, i); the vocabulary projection is read after the last layer.
  std::vector<double> prefix(static_cast<size_t>(layers) + 1, 0.0);
  for (int64_t i = 0; i < layers; ++i)
    prefix[static_cast<size_t>(i + 1)] =
        prefix[static_cast<size_t>(i)] + static_cast<double>(layer_bytes(w.layers[static_cast<size_t>(i)]));
  const double total = prefix.back() + static_cast<double>(w.lm_head.num_bytes);
  // Boundary k (1..stages-1) where the running bytes come closest to k / stages of the total,
  // leaving at least one layer to each stage on either side.
  std::vector<int64_t> bounds = {0};
  for (int k = 1; k < stages; ++k) {
    const double target = total * k / stages;
    int64_t best = bounds.back() + 1;
    for (int64_t i = best; i <= layers - (stages - k); ++i) {
      if (std::abs(prefix[static_cast<size_t>(i)] - target) <
          std::abs(prefix[static_cast<size_t>(best)] - target))
        best = i;
    }
    bounds.push_back(best);
  }
  bounds.push_back(layers);
  PipelineStage s;
  s.stage = stage;
  s.stages = stages;
  s.layer_begin = bounds[static_cast<size_t>(stage)];
  s.layer_end = bounds[static_cast<size_t>(stage + 1)];
  return s;
}

Status pipeline_weights(ModelWeights& w, const PipelineStage& s) {
  if (s.stages == 1) return Status::ok();
  if (w.stage.stages != 1) return invalid_argument("pipeline parallel: the weights are split already");
  if (s.layer_begin < 0 || s.layer_end > static_cast<int64_t>(w.layers.size()) ||
      s.layer_begin >= s.layer_end)
    return invalid_argument("pipeline parallel: layers out of range");
  std::vector<LayerWeights> kept(std::make_move_iterator(w.layers.begin() + s.layer_begin),
                                 std::make_move_iterator(w.layers.begin() + s.layer_end));
  w.layers = std::move(kept);
  w.config.num_layers = s.layer_end - s.layer_begin;
  size_t bytes = 0;
  for (const LayerWeights& l : w.layers) bytes += layer_bytes(l);
  if (s.first()) bytes += w.token_embedding.num_bytes;
  if (s.last() && !(s.first() && w.config.tie_word_embeddings)) bytes += w.lm_head.num_bytes;
  w.weight_bytes = bytes;
  w.stage = s;
  return Status::ok();
}

MicroBatchPlan plan_micro_batches(int64_t n, int64_t min_tokens, int64_t max_batches) {
  MicroBatchPlan p;
  const int64_t cap = std::clamp<int64_t>(max_batches, 1, 64);
  p.count = std::clamp<int64_t>(min_tokens > 0 ? n / min_tokens : n, 1, cap);
  for (int64_t m = 0; m <= p.count; ++m) p.bounds[m] = n * m / p.count;
  return p;
}

}  // namespace inferd
