// Layer pruning (`inferd prune --drop-layers LIST`): a GGUF model rewritten without some of its
// transformer layers (the layers after each dropped one renumbered, block_count lowered; every
// other tensor and key copied). A smaller model of the same vocabulary: a draft for speculative
// decoding, or a slimmer model where quality allows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

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

// Writes `input` (a GGUF model) to `output` without the layers `drop`. Refused: a layer index out
// of range, dropping every layer, output == input, a file that is not a GGUF model.
Expected<PruneReport> prune_gguf_layers(const std::string& input, const std::string& output,
                                        const std::vector<int64_t>& drop);

}  // namespace inferd
