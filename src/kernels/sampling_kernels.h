// The sampler's passes over a vocabulary of logits (49k-152k per sequence and step, on the engine
// thread), on the CPU's vector unit: the greedy token, and the weights of sampling from a whole
// distribution, exp(logit / temperature - max) for every token with sums per block, from which a
// sampler draws in two levels (the block, then the token inside it) without sorting or a pass
// over every token in order.
#pragma once

#include <cstdint>

#include "kernels/cpu_isa.h"

namespace inferd {

// The index of the first largest of x[0 .. n) (n >= 1): a NaN is never larger, and a NaN at x[0]
// gives 0 (the plain loop's answer: nothing is larger than it). Every isa gives the same index.
int64_t argmax(const float* x, int64_t n, Isa isa);

// Tokens per entry of block_sums.
inline constexpr int64_t kSoftmaxBlock = 1024;

// For x[0 .. n) (n >= 1) and temperature > 0:
// w[i] = exp_poly(x[i] / temperature - m) (kernels/exp_poly.h), where m = max_i x[i] / temperature; 0 where
// x[i] is -inf (a token ruled out). block_sums[b] (ceil(n / kSoftmaxBlock) of them) is the float sum of block
// b's weights, added into 16 lanes (weight i into lane i % 16, in order) and then the lanes 0 to 15 in order.
// Returns m. Every x -inf: m is -inf, every weight and sum 0. Every isa (at most what the CPU runs) gives the
// same bits.
float softmax_weights(const float* x, int64_t n, float temperature, float* w, float* block_sums, Isa isa);

}  // namespace inferd
