#include "kernels/attention.h"

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "common/half.h"
#include "kernels/f32_kernels.h"

namespace inferd {

namespace {

// Reads n elements of type T as f32 into out (identity for float).
template <typename T>
const float* as_f32(const void* p, int64_t n, float* out);
template <>
const float* as_f32<float>(const void* p, int64_t, float*) {
  return static_cast<const float*>(p);
}
struct F16 {};
struct BF16 {};
template <>
const float* as_f32<F16>(const void* p, int64_t n, float* out) {
  f32_kernels().f16_to_f32(static_cast<const uint16_t*>(p), out, n);
  return out;
}
template <>
const float* as_f32<BF16>(const void* p, int64_t n, float* out) {
  const auto* h = static_cast<const uint16_t*>(p);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
  return out;
}

template <typename T>
constexpr size_t kElementBytes = std::is_same_v<T, float> ? 4 : 2;

template <typename T>
void attend(const float* q, std::span<const AttentionSequence> sequences,
            std::span<const int32_t> token_sequence, const KvLayerView& kv, const AttentionShape& shape,
            float* out, ThreadPool& pool);

}  // namespace

void paged_attention(const float* q, std::span<const AttentionSequence> sequences,
                     std::span<const int32_t> token_sequence, const KvLayerView& kv,
                     const AttentionShape& shape, float* out, ThreadPool& pool) {
  switch (kv.dtype) {
    case KvDType::kF32: return attend<float>(q, sequences, token_sequence, kv, shape, out, pool);
    case KvDType::kF16: return attend<F16>(q, sequences, token_sequence, kv, shape, out, pool);
    case KvDType::kBF16: return attend<BF16>(q, sequences, token_sequence, kv, shape, out, pool);
  }
}

namespace {

template <typename T>
void attend(const float* q, std::span<const AttentionSequence> sequences,
            std::span<const int32_t> token_sequence, const KvLayerView& kv, const AttentionShape& shape,
            float* out, ThreadPool& pool) {
  const int64_t hd = shape.head_dim;
  const int64_t q_dim = shape.num_heads * hd;
  const int64_t kv_dim = shape.num_kv_heads * hd;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const auto num_items = static_cast<int64_t>(token_sequence.size()) * shape.num_heads;
  const F32Kernels& kernels = f32_kernels();
  pool.parallel_for(num_items, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<float> row(static_cast<size_t>(hd));
    if (static_cast<int64_t>(row.size()) < hd) row.resize(static_cast<size_t>(hd));
    const auto* key_base = static_cast<const std::byte*>(kv.key);
    const auto* value_base = static_cast<const std::byte*>(kv.value);
    // One head's K or V of a slot, as f32 (converted into `row` unless stored as f32).
    auto head = [&](const std::byte* base, int64_t slot, int64_t kv_offset) {
      return as_f32<T>(base + static_cast<size_t>(slot * kv_dim + kv_offset) * kElementBytes<T>, hd,
                       row.data());
    };
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / shape.num_heads;
      const int64_t h = item % shape.num_heads;
      const AttentionSequence& seq = sequences[static_cast<size_t>(token_sequence[static_cast<size_t>(t)])];
      const int64_t pos = seq.context_len - seq.num_queries + (t - seq.query_start);
      const int64_t n_ctx = pos + 1;
      if (static_cast<int64_t>(scores.size()) < n_ctx) scores.resize(static_cast<size_t>(n_ctx));
      const float* qv = q + t * q_dim + h * hd;
      const int64_t kv_offset = (h / group) * hd;
      auto slot_of = [&](int64_t p) {
        return static_cast<int64_t>(seq.block_table[static_cast<size_t>(p / kv.block_size)]) * kv.block_size +
               p % kv.block_size;
      };
      float max_score = -INFINITY;
      for (int64_t p = 0; p < n_ctx; ++p) {
        const float s = kernels.dot(qv, head(key_base, slot_of(p), kv_offset), hd) * shape.scale;
        scores[static_cast<size_t>(p)] = s;
        max_score = std::max(max_score, s);
      }
      float sum = 0;
      for (int64_t p = 0; p < n_ctx; ++p) {
        const float e = std::exp(scores[static_cast<size_t>(p)] - max_score);
        scores[static_cast<size_t>(p)] = e;
        sum += e;
      }
      const float inv_sum = 1.0f / sum;
      float* o = out + t * q_dim + h * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = 0;
      for (int64_t p = 0; p < n_ctx; ++p) {
        const float w = scores[static_cast<size_t>(p)] * inv_sum;
        const float* vv = head(value_base, slot_of(p), kv_offset);
        for (int64_t d = 0; d < hd; ++d) o[d] += w * vv[d];
      }
    }
  });
}

}  // namespace

}  // namespace inferd
