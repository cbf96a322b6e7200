// The CUDA kernels of the CUDA backend (cuda_ops.cu), as host functions that enqueue them on a
// stream. Every pointer is device memory. The host side (cuda_backend.cpp) owns the buffers, the
// cuBLAS handle and the copies between host and device; this header needs only the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace inferd::cuda {

// y[r] = x[r] / rms(x[r]) * weight, rows of n (y may be x); the sum of squares in double, as the
// CPU kernel sums it.
void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t n, float eps,
              cudaStream_t s);

// RoPE of `tokens` tokens in place: q [tokens][num_q_heads * head_dim], k [tokens][num_kv_heads *
// head_dim], token t at position pos[t]; pairing 0 = NeoX (i with i + head_dim / 2), 1 =
// interleaved (2i with 2i + 1); cos and sin from the f32 angle pos * inv_freq[i] in double, times scale.
void rope_qk(float* q, int64_t num_q_heads, float* k, int64_t num_kv_heads, int64_t head_dim, int64_t tokens,
             const int64_t* pos, const float* inv_freq, int pairing, float scale, cudaStream_t s);

// out = silu(gate) * up, n values.
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t s);

// y[t * ld + r] += bias[r] for rows r < rows, tokens t.
void add_bias(float* y, int64_t ld, int64_t rows, int64_t tokens, const float* bias, cudaStream_t s);

// x rounded to f16 / bf16 (nearest even), n values: the 16-bit GEMMs' activations.
void to_f16(const float* x, void* out, int64_t n, cudaStream_t s);
void to_bf16(const float* x, void* out, int64_t n, cudaStream_t s);

// Q8_0 weights (GGUF blocks of 32: an f16 scale, then 32 int8) times activations quantized the same
// way (W8A8): the activations of `tokens` rows of k (k a multiple of 32) are quantized into xq
// (tokens * k bytes) and xd (tokens * k / 32 scales), then y[t * ld + r] = sum over blocks of
// d_w * d_x * (int32 dot product of the block) for rows r < rows.
void q8_0_matmul(const void* w, int64_t rows, int64_t k, const float* x, int64_t tokens, int8_t* xq,
                 float* xd, float* y, int64_t ld, cudaStream_t s);

// Paged causal attention over a flattened batch (the CPU kernel's contract, kernels/attention.h,
// without windows): token t of sequence seq[t] sits at position pos[t] and sees positions 0..pos[t]
// of its sequence; position p lives in slot table[table_start[seq] + p / block_size] * block_size
// + p % block_size. K and V: [slots][num_kv_heads * head_dim] of kv_dtype (0 f32, 1 f16, 2 bf16, 3
// int8, 4 fp8 E4M3; the 8-bit ones with f32 scales [slots][num_kv_heads]). q and out: [tokens]
// [num_heads * head_dim]; head_dim <= 256. Each (token, head) is one thread block whose warps
// split the positions and merge their online softmaxes in a fixed order: the result does not
// depend on the rest of the batch.
struct AttentionArgs {
  const float* q = nullptr;
  float* out = nullptr;
  const int32_t* seq = nullptr;
  const int64_t* pos = nullptr;
  const int32_t* table = nullptr;
  const int64_t* table_start = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;
  const float* key_scale = nullptr;
  const float* value_scale = nullptr;
  int kv_dtype = 0;
  int64_t tokens = 0;
  int64_t block_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
};
void paged_attention(const AttentionArgs& a, cudaStream_t s);

}  // namespace inferd::cuda
