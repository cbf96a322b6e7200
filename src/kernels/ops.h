// Element-wise and per-row operators of the transformer: RMSNorm, RoPE, SiLU-gating.
// Scalar code with a fixed order of operations; the transformer calls them per token.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_isa.h"

namespace inferd {

// y = x / sqrt(mean(x^2) + eps) * weight, over one row of n values. y may alias x. The sum of
// squares is taken in double in 16 interleaved partial sums and a fixed tree, so every ISA path
// (`isa`: tests; active_isa() otherwise) gives the same bits.
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps, Isa isa);

// Inverse frequencies theta^(-2i/head_dim), i < head_dim/2, rounded as Hugging Face does in f32.
std::vector<float> rope_inverse_frequencies(int64_t head_dim, double theta);

enum class RopePairing { kNeox, kInterleaved };

// Rotates each of `num_heads` heads of `x` ([num_heads, head_dim], in place) by position `pos`.
// kNeox pairs dimension i with i + head_dim/2; kInterleaved pairs 2i with 2i + 1. cos and sin
// are multiplied by `scale` (YaRN's attention factor), as transformers does.
void rope(float* x, int64_t num_heads, int64_t head_dim, int64_t pos, const float* inv_freq,
          RopePairing pairing, float scale = 1.0f);

// rope() of a token's query heads and key heads at one position, the angles computed once for
// both (bit-identical to two rope() calls).
void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim, int64_t pos,
             const float* inv_freq, RopePairing pairing, float scale = 1.0f);

// The cosines and sines rope_qk rotates a token at `pos` by, times `scale`: cos_sin[i] and
// cos_sin[head_dim / 2 + i] for pair i. A prompt's tokens take them once for every layer.
void rope_cos_sin(int64_t pos, const float* inv_freq, int64_t head_dim, float scale, float* cos_sin);

// rope_qk with the rotation's cosines and sines from rope_cos_sin (bit-identical to rope_qk).
void rope_qk_table(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim,
                   const float* cos_sin, RopePairing pairing);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

}  // namespace inferd
