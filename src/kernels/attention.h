// Causal attention of a flattened batch of sequences over paged K/V (read through block tables).
// The transformer calls it once per layer after writing the new tokens' K/V into the cache.
#pragma once

#include <cstdint>
#include <numeric>
#include <span>

#include "common/thread_pool.h"
#include "kernels/cpu_isa.h"

namespace inferd {

// One sequence of the batch. Its new tokens are rows [query_start, query_start + num_queries)
// of q; they sit at positions context_len - num_queries ... context_len - 1, and attend to
// positions 0 ... their own (causal). Position p of the sequence lives in cache slot
// block_table[i / block_size] * block_size + i % block_size, i = p (minus `evicted` past the sink).
//
// With a window (StreamingLLM: attention sinks + a sliding window), a query at position p sees
// the sink, positions [0, sink_len), and the positions from window_start(p) to p:
//
//   positions:  | sink | evicted (no slots) | not seen by p | window_start(p) ... p |
//
// The sink is scored with the query rotated as if the sink sat right before the window (the
// cache positions StreamingLLM gives it): sink_q, which the transformer fills. The keys keep
// the rotation of their own positions, so the window's relative distances are exact and no key
// is ever rewritten (blocks stay shareable, 8-bit keys are not requantized).
struct AttentionSequence {
  int64_t query_start = 0;
  int64_t num_queries = 0;
  int64_t context_len = 0;
  std::span<const int32_t> block_table;
  int64_t window = 0;    // 0: full causal attention; else >= kWindowGranule tokens
  int64_t sink_len = 0;  // a multiple of kWindowGranule (0: no sink)
  // Positions [sink_len, sink_len + evicted) have no slot (their blocks were given back); no
  // query of the step may see them. A multiple of kWindowGranule.
  int64_t evicted = 0;
  // [num_queries][num_heads * head_dim]: the queries the sink is scored with (set by the
  // transformer for a windowed sequence; null: the queries themselves).
  const float* sink_q = nullptr;
};

// A window's start, its sink and its evicted positions are multiples of this many positions
// (the attention kernel's chunk), so a chunk of positions is seen whole or not at all.
inline constexpr int64_t kWindowGranule = 16;

// First position past the sink that a query at `pos` of a windowed sequence sees: the last
// `window` positions up to and including pos, extended down to a multiple of kWindowGranule.
inline int64_t window_start(const AttentionSequence& s, int64_t pos) {
  const int64_t lo = pos + 1 - s.window;
  const int64_t aligned = lo <= 0 ? 0 : lo / kWindowGranule * kWindowGranule;
  return aligned > s.sink_len ? aligned : s.sink_len;
}

// Positions between the sink and a query's window: the sink is scored with the query rotated at
// pos - sink_gap(pos).
inline int64_t sink_gap(const AttentionSequence& s, int64_t pos) {
  return s.window > 0 ? window_start(s, pos) - s.sink_len : 0;
}

// StreamingLLM (attention sinks + a sliding window), opt-in per request: each token attends to
// the first sink_tokens of the sequence (rounded up to whole blocks and to 16) and to the last
// window_tokens before it (rounded down to 16), and the KV blocks in between are given back as
// the sequence grows, so a request may run past the KV pool and past the model's context.
struct StreamingWindow {
  int64_t sink_tokens = 0;
  int64_t window_tokens = 0;  // 0: off (full attention)
  bool enabled() const { return window_tokens > 0; }
};

// Positions the sink of `w` covers in a cache of `block_size`-token blocks: sink_tokens rounded
// up to a multiple of both the block size and the attention kernel's 16 (0 without a sink).
inline int64_t streaming_sink_len(const StreamingWindow& w, int64_t block_size) {
  const int64_t unit = std::lcm<int64_t>(block_size, 16);
  return (w.sink_tokens + unit - 1) / unit * unit;
}

// Element type of the KV cache; attention math is f32 whatever it is. kInt8 and kFp8 (E4M3)
// store one byte per element with an f32 scale per token and KV head: element i of head h of
// slot s is code * scale[s * num_kv_heads + h] (the scale maps the head's largest magnitude to
// 127, or to 448 for FP8). The values' order is fixed: part of the file/wire formats.
enum class KvDType { kF32, kF16, kBF16, kInt8, kFp8 };

inline bool kv_dtype_is_8bit(KvDType dtype) {
  return dtype == KvDType::kInt8 || dtype == KvDType::kFp8;
}

// Slots per group of a cache that stores K in groups (KvLayerView::key_groups): attention's chunk.
inline constexpr int64_t kKeyGroup = 16;

// K/V of one layer: slot s holds value[s * kv_dim ...] (elements of `dtype`), kv_dim =
// num_kv_heads * head_dim, and the same for key[], unless key_groups: then K is stored in groups
// of kKeyGroup consecutive slots, each group [kv_dim][kKeyGroup] (element i of slot s at
// (s - s % 16) * kv_dim + i * 16 + s % 16), so that attention reads a head's keys of 16 positions
// as 16-wide rows instead of transposing them; it needs block_size % kKeyGroup == 0 (a group never
// straddles blocks, and an aligned chunk of 16 positions is one group). For the 8-bit dtypes
// key_scale / value_scale hold [slots][num_kv_heads] scales, in either layout.
struct KvLayerView {
  const void* key = nullptr;
  const void* value = nullptr;
  int64_t block_size = 0;
  KvDType dtype = KvDType::kF32;
  const float* key_scale = nullptr;
  const float* value_scale = nullptr;
  bool key_groups = false;
};

// Index, in elements, of element i of slot s's key in a grouped K of kv_dim elements a slot.
inline int64_t key_group_index(int64_t slot, int64_t i, int64_t kv_dim) {
  return (slot - slot % kKeyGroup) * kv_dim + i * kKeyGroup + slot % kKeyGroup;
}

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
