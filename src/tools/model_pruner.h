// Structured pruning (`inferd prune`): a model rewritten without some of its transformer layers,
// attention heads or FFN channels. Layers: the layers after each dropped one renumbered,
// block_count lowered. Heads: the same number of query heads removed from every KV group of
// every layer (their rows of Q, their columns of O; with one query head per KV head, the K and V
// heads go with them). FFN channels: the same number removed from every layer (rows of gate and
// up, columns of down). Every other tensor and key is copied. A GGUF model is written as GGUF, a
// Hugging Face directory as a directory of safetensors. A smaller model of the same vocabulary:
// a draft for speculative decoding, or a slimmer model where quality allows.
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
  int64_t layers_in = 0, layers_out = 0;
  int64_t heads_in = 0, heads_out = 0;        // query heads per layer
  int64_t kv_heads_in = 0, kv_heads_out = 0;  // KV heads per layer
  int64_t ffn_in = 0, ffn_out = 0;            // FFN channels per layer
  int64_t tensors_out = 0;
  // Matrices whose kept columns split a quantization block: expanded to f32 and rounded again
  // (to their own type where inferd writes it, else to Q8_0 or F16).
  int64_t requantized = 0;
  uint64_t input_bytes = 0;   // tensor data
  uint64_t output_bytes = 0;  // tensor data
};

// "3,5,10-19": layer indices and inclusive ranges, in any order; refused naming the part that is
// not a number or range, or an empty list.
Expected<std::vector<int64_t>> parse_layer_list(const std::string& text);

// What a calibration run measures, per layer of the model:
// - layer: Block Influence (ShortGPT, Men et al. 2024), the mean over the calibration tokens of
//   1 - cos(hidden before the layer, hidden after it). A layer that barely turns the residual
//   stream matters least.
// - head[l][h]: the mean squared norm of query head h's contribution to the residual stream,
//   E ||W_o[:, h] o_h||^2 (exact, from the covariance of the head's attention output).
// - channel[l][j]: the same for FFN channel j, E[a_j^2] ||W_down[:, j]||^2 (a_j the input of
//   down), as Wanda scores a weight by |w| times its input's norm. Empty for MoE layers.
// The model runs over `tokens` in chunks of `context` (at most `max_chunks`, 0 = all) on the f32
// path.
struct StructureImportance {
  std::vector<double> layer;
  std::vector<std::vector<double>> head;
  std::vector<std::vector<double>> channel;
  int64_t tokens = 0;        // calibration tokens seen
  int64_t num_kv_heads = 0;  // the model's, for heads_to_keep
};
Expected<StructureImportance> structure_importance(const std::string& model,
                                                   const std::string& calibration_file, int64_t context,
                                                   int64_t max_chunks);
// The same over tokens already encoded.
Expected<StructureImportance> structure_importance(const ModelWeights& weights,
                                                   std::span<const int32_t> tokens, int64_t context,
                                                   int64_t max_chunks, ThreadPool& pool);

// The `count` layers of least influence, ascending by index; never layer 0 nor the last (the
// first and last layers reshape the stream for the embedding and the head).
std::vector<int64_t> least_important_layers(const std::vector<double>& influence, int64_t count);

// Per layer, the query heads to keep (ascending) when `ratio` of them go, least important
// first, the same number in every KV group and every layer: round(ratio x group size) of each
// group; with one query head per KV head, round(ratio x heads) heads with their K and V. Refused
// (naming --prune-heads): a ratio outside (0, 1), or one that removes no head or every head of a
// group.
Expected<std::vector<std::vector<int64_t>>> heads_to_keep(const std::vector<std::vector<double>>& importance,
                                                          int64_t num_heads, int64_t num_kv_heads,
                                                          double ratio);

// Per layer, the FFN channels to keep (ascending) when `ratio` of them go, least important first:
// the same number in every layer, intermediate - round(ratio x intermediate) rounded to a
// multiple of 32 (the quantization block of down's rows). Refused (naming --prune-ffn): a ratio
// outside (0, 1), or one that keeps every channel or none.
Expected<std::vector<std::vector<int64_t>>> channels_to_keep(
    const std::vector<std::vector<double>>& importance, double ratio);

// What prune_model cuts; indices are the input model's.
struct PrunePlan {
  std::vector<int64_t> drop_layers;
  std::vector<std::vector<int64_t>> keep_heads;     // per layer; empty: every head kept
  std::vector<std::vector<int64_t>> keep_channels;  // per layer; empty: every channel kept
};

// Writes `input` (a GGUF model, or a Hugging Face directory) to `output` (a GGUF file, or a
// directory with model.safetensors, config.json and every other file copied) without what `plan`
// cuts. Refused: a layer index out of range, dropping every layer, head lists that leave the KV
// groups unequal or differ in length between layers, channel lists of unequal length, FFN
// pruning of a mixture-of-experts model, output == input, an input that is not a model.
Expected<PruneReport> prune_model(const std::string& input, const std::string& output, const PrunePlan& plan);

}  // namespace inferd
