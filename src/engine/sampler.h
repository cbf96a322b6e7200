// Sampler: turns one row of logits into the next token (greedy or seeded random sampling).
// The engine calls it per sampling row after the forward pass.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "common/status.h"

namespace inferd {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  std::optional<uint64_t> seed;

  // Checks the ranges; names the offending field.
  Status validate() const;
};

class Sampler final {
 public:
  // The random stream is seeded from params.seed (or from the OS when absent).
  explicit Sampler(const SamplingParams& params);

  // Picks a token from `logits` ([vocab]). Greedy ties go to the lowest id. Allocates only
  // when the vocabulary grows.
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest value (lowest index on ties).
int32_t argmax(std::span<const float> values);

}  // namespace inferd
