#include "model/expert_routing.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/check.h"

namespace inferd {

void top_k_indices(std::span<const float> values, int64_t k, std::span<int32_t> indices,
                   std::vector<std::pair<float, int64_t>>& queue) {
  const auto n = static_cast<int64_t>(values.size());
  INFERD_CHECK(k >= 1 && k <= n && static_cast<int64_t>(indices.size()) == k);
  using Elem = std::pair<float, int64_t>;
  queue.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) queue[static_cast<size_t>(j)] = {values[static_cast<size_t>(j)], j};
  // aten/src/ATen/native/TopKImpl.h (largest, sorted): the same algorithms on the same pairs with
  // the same comparator give the same order, ties and all.
  auto larger = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), larger);
  } else {
    std::nth_element(queue.begin(), queue.begin() + (k - 1), queue.end(), larger);
    std::sort(queue.begin(), queue.begin() + (k - 1), larger);
  }
  for (int64_t j = 0; j < k; ++j)
    indices[static_cast<size_t>(j)] = static_cast<int32_t>(queue[static_cast<size_t>(j)].second);
}

void route_tokens(const float* logits, int64_t tokens, int64_t num_experts, int64_t k, bool normalize,
                  ExpertRouting* out) {
  INFERD_CHECK(k >= 1 && k <= num_experts);
  const auto pairs = static_cast<size_t>(tokens * k);
  std::vector<float>& probs = out->probs;
  std::vector<int32_t>& chosen = out->chosen;
  std::vector<float>& chosen_p = out->chosen_weights;
  probs.resize(static_cast<size_t>(num_experts));
  chosen.resize(pairs);
  chosen_p.resize(pairs);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * num_experts;
    float max = row[0];
    for (int64_t e = 1; e < num_experts; ++e) max = std::max(max, row[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      probs[static_cast<size_t>(e)] = std::exp(row[e] - max);
      sum += probs[static_cast<size_t>(e)];
    }
    for (float& p : probs) p /= sum;
    std::span<int32_t> idx(chosen.data() + t * k, static_cast<size_t>(k));
    top_k_indices(probs, k, idx, out->queue);
    float* w = chosen_p.data() + t * k;
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = probs[static_cast<size_t>(idx[static_cast<size_t>(j)])];
      top_sum += w[j];
    }
    if (normalize) {
      for (int64_t j = 0; j < k; ++j) w[j] /= top_sum;
    }
  }
  // Counting sort by expert; tokens stay ascending within each expert.
  out->offsets.assign(static_cast<size_t>(num_experts) + 1, 0);
  for (int32_t e : chosen) ++out->offsets[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < num_experts; ++e)
    out->offsets[static_cast<size_t>(e) + 1] += out->offsets[static_cast<size_t>(e)];
  out->tokens.resize(pairs);
  out->weights.resize(pairs);
  std::vector<int32_t>& fill = out->fill;
  fill.assign(out->offsets.begin(), out->offsets.end() - 1);
  for (size_t i = 0; i < pairs; ++i) {
    const auto slot = static_cast<size_t>(fill[static_cast<size_t>(chosen[i])]++);
    out->tokens[slot] = static_cast<int32_t>(i / static_cast<size_t>(k));
    out->weights[slot] = chosen_p[i];
  }
}

}  // namespace inferd
