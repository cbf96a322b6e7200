// ExpertRouting: which experts each token of a step goes to, and with what weight, grouped by
// expert so each expert's weights are read once per step. Built by route_tokens() from the
// router's logits; read by MoeMlp (moe_mlp.h). Plain data, no backend.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace inferd {

// The (token, weight) pairs of one step, grouped by expert:
//
//   expert:      0        1     2 (none)   3 ...
//   offsets:     0        3     5          5 ...      [num_experts + 1]
//   tokens:    | 0 2 7  | 1 2 |            | ...      ascending within an expert
//   weights:   | p p p  | p p |            | ...      the token's routing weight for that expert
struct ExpertRouting {
  std::vector<int32_t> offsets;  // [num_experts + 1]: expert e's pairs are [offsets[e], offsets[e + 1])
  std::vector<int32_t> tokens;   // [tokens * k]
  std::vector<float> weights;    // [tokens * k]
  // Scratch of route_tokens, kept between steps so routing allocates only when a batch grows.
  std::vector<float> probs;                      // [num_experts]
  std::vector<std::pair<float, int64_t>> queue;  // [num_experts]
  std::vector<int32_t> chosen;                   // [tokens * k] experts in top-k order
  std::vector<float> chosen_weights;             // [tokens * k]
  std::vector<int32_t> fill;                     // [num_experts]

  int64_t num_rows(int64_t expert) const {
    return offsets[static_cast<size_t>(expert) + 1] - offsets[static_cast<size_t>(expert)];
  }
};

// The indices of the k largest values, in the order torch.topk (CPU, sorted) returns them, ties
// included: the same std::partial_sort (k * 64 <= n) or std::nth_element + std::sort of the
// first k - 1 over (value, index) pairs with torch's comparator (NaN counts as largest).
// indices: [k]; k in [1, values.size()]. `queue` is scratch.
void top_k_indices(std::span<const float> values, int64_t k, std::span<int32_t> indices,
                   std::vector<std::pair<float, int64_t>>& queue);

// Routes `tokens` rows of router logits [tokens, num_experts] as Qwen2-MoE / Qwen3-MoE do:
// softmax in f32, top-k, and with `normalize` the k probabilities divided by their sum (in top-k
// order). Each token's result depends on its own row only. Reuses `out`'s storage.
void route_tokens(const float* logits, int64_t tokens, int64_t num_experts, int64_t k, bool normalize,
                  ExpertRouting* out);

}  // namespace inferd
