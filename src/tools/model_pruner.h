// Layer pruning (`inferd prune --drop-layers LIST`): a GGUF model rewritten without some of its
// transformer layers (the layers after each dropped one renumbered, block_count lowered; every
// other tensor and key copied). A smaller model of the same vocabulary: a draft for speculative
// decoding, or a slimmer model where quality allows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model_weights.h"

namespace inferd {

struct PruneReport {
  int64_t layers_in = 0;
  int64_t layers_out = 0;
  int64_t tensors_out = 0;
  uint64_t input_bytes = 0;   // tensor data
  uint64_t output_bytes = 0;  // tensor data
};

// "3,5,10-19": layer indices and inclusive ranges, in any order; refused naming the part that is
// not a number or range, or an empty list.
Expected<std::vector<int64_t>> parse_layer_list(const std::string& text);

// Block Influence of each layer (ShortGPT, Men et al. 2024): the mean over the calibration
// tokens of 1 - cos(hidden before the layer, hidden after it). A layer that barely turns the
// residual stream matters least. The model runs over `tokens` in chunks of `context` (at most
// `max_chunks`, 0 = all) on the f32 path.
struct LayerImportance {
  std::vector<double> influence;  // per layer
  int64_t tokens = 0;             // calibration tokens seen
};
Expected<LayerImportance> layer_importance(const std::string& model, const std::string& calibration_file,
                                           int64_t context, int64_t max_chunks);
// The same over tokens already encoded.
Expected<LayerImportance> layer_importance(const ModelWeights& weights, std::span<const int32_t> tokens,
                                           int64_t context, int64_t max_chunks, ThreadPool& pool);
// The `count` layers of least influence, ascending by index; never layer 0 nor the last (the
// first and last layers reshape the stream for the embedding and the head).
std::vector<int64_t> least_important_layers(const std::vector<double>& influence, int64_t count);

// Writes `input` (a GGUF model) to `output` without the layers `drop`. Refused: a layer index out
// of range, dropping every layer, output == input, a file that is not a GGUF model.
Expected<PruneReport> prune_gguf_layers(const std::string& input, const std::string& output,
                                        const std::vector<int64_t>& drop);

}  // namespace inferd
