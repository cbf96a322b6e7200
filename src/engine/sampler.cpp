#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace inferd {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return invalid_argument("temperature must be >= 0");
  if (top_k < 0) return invalid_argument("top_k must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return invalid_argument("top_p must be in (0, 1]");
  return Status::ok();
}

int32_t argmax(std::span<const float> values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    candidates_[i] = {logits[i] / params_.temperature, static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                      candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the kept candidates (sorted, largest first).
  const float max_logit = candidates_[0].first;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    candidates_[i].first = std::exp(candidates_[i].first - max_logit);
    total += candidates_[i].first;
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += candidates_[i].first / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = 0;
    for (size_t i = 0; i < keep; ++i) total += candidates_[i].first;
  }
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += candidates_[i].first;
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace inferd
