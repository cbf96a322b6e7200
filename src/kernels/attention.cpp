#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "kernels/matmul.h"

namespace inferd {

void paged_attention(const float* q, std::span<const AttentionSequence> sequences,
                     std::span<const int32_t> token_sequence, const KvLayerView& kv,
                     const AttentionShape& shape, float* out, ThreadPool& pool) {
  const int64_t hd = shape.head_dim;
  const int64_t q_dim = shape.num_heads * hd;
  const int64_t kv_dim = shape.num_kv_heads * hd;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const auto num_items = static_cast<int64_t>(token_sequence.size()) * shape.num_heads;
  pool.parallel_for(num_items, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
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
        const float s = dot_f32(qv, kv.key + slot_of(p) * kv_dim + kv_offset, hd) * shape.scale;
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
        const float* vv = kv.value + slot_of(p) * kv_dim + kv_offset;
        for (int64_t d = 0; d < hd; ++d) o[d] += w * vv[d];
      }
    }
  });
}

}  // namespace inferd
