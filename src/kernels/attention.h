// Causal attention of a flattened batch of sequences over paged K/V (read through block tables).
// The transformer calls it once per layer after writing the new tokens' K/V into the cache.
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"

namespace inferd {

// One sequence of the batch. Its new tokens are rows [query_start, query_start + num_queries)
// of q; they sit at positions context_len - num_queries ... context_len - 1, and attend to
// positions 0 ... their own (causal). Position p of the sequence lives in cache slot
// block_table[p / block_size] * block_size + p % block_size.
struct AttentionSequence {
  int64_t query_start = 0;
  int64_t num_queries = 0;
  int64_t context_len = 0;
  std::span<const int32_t> block_table;
};

// Element type of the KV cache; attention math is f32 whatever it is. kInt8 and kFp8 (E4M3)
// store one byte per element with an f32 scale per token and KV head: element i of head h of
// slot s is code * scale[s * num_kv_heads + h] (the scale maps the head's largest magnitude to
// 127, or to 448 for FP8). The values' order is fixed: part of the file/wire formats.
enum class KvDType { kF32, kF16, kBF16, kInt8, kFp8 };

inline bool kv_dtype_is_8bit(KvDType dtype) {
  return dtype == KvDType::kInt8 || dtype == KvDType::kFp8;
}

// K/V of one layer: slot s holds key[s * kv_dim ...] and value[s * kv_dim ...] (elements of
// `dtype`), kv_dim = num_kv_heads * head_dim. For the 8-bit dtypes key_scale / value_scale hold
// [slots][num_kv_heads] scales.
struct KvLayerView {
  const void* key = nullptr;
  const void* value = nullptr;
  int64_t block_size = 0;
  KvDType dtype = KvDType::kF32;
  const float* key_scale = nullptr;
  const float* value_scale = nullptr;
};

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // query head h reads kv head h / (num_heads / num_kv_heads)
  int64_t head_dim = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
};

// out[t, h, :] = softmax(q[t, h, :] . K^T * scale) V over the causal context of token t.
// q, out: [num_tokens, num_heads * head_dim]. token_sequence[t] is t's index in `sequences`.
// Flash-style (online softmax over chunks of 16 positions, K/V converted to f32 once per chunk
// for all query heads of a KV head and up to 8 tokens of a sequence). Each (token, head) is
// computed in a fixed order, independent of the rest of the batch. `isa` picks the path
// (AVX-512 or portable; tests run both).
void paged_attention(const float* q, std::span<const AttentionSequence> sequences,
                     std::span<const int32_t> token_sequence, const KvLayerView& kv,
                     const AttentionShape& shape, float* out, ThreadPool& pool, Isa isa = active_isa());

}  // namespace inferd
