#include "model/transformer.h"

#include <cmath>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "tensor/dequantize.h"

namespace inferd {

namespace {

// Whether a dtype has a packed kernel worth taking on this CPU: the integer kernels always; the
// float kernel where AVX-512 runs it (elsewhere the f32 path's AVX2 dot products are faster).
bool packable(DType dtype) {
  if (!PackedWeight::supports(dtype)) return false;
  return !PackedWeight::is_float_dtype(dtype) ||
         static_cast<int>(active_isa()) >= static_cast<int>(Isa::kAvx512);
}

}  // namespace

Transformer::Linear Transformer::prepare(std::initializer_list<const TensorView*> parts, bool swiglu) const {
  Linear out;
  const std::span<const TensorView* const> span(parts.begin(), parts.size());
  if (path_ == MatmulPath::kF32) return out;
  // oneDNN where it beats our kernels: BF16 weights (vdpbf16ps / AMX-BF16; on F32 it measured
  // level with the packed float kernel, on F16 expanded to f32 slower: BENCHMARKS.md).
  if (path_ == MatmulPath::kOneDnn && (*parts.begin())->dtype == DType::kBF16) {
    auto w = OneDnnWeight::create(span, swiglu, pool_.num_threads());
    if (w) out.onednn.emplace(std::move(w).value());
    return out;
  }
  for (const TensorView* p : parts) {
    if (!packable(p->dtype)) return out;
  }
  auto packed = swiglu ? PackedWeight::pack_swiglu(*span[0], *span[1]) : PackedWeight::pack(span);
  if (packed) out.packed.emplace(std::move(packed).value());
  return out;
}

Transformer::Transformer(const ModelWeights& weights, ThreadPool& pool, TransformerOptions options)
    : weights_(weights),
      pool_(pool),
      inv_freq_(rope_inverse_frequencies(weights.config.head_dim, weights.config.rope_theta)),
      path_(options.matmul) {
  packed_.resize(weights.layers.size());
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    PackedLayer& p = packed_[i];
    p.qkv = prepare({&l.wq, &l.wk, &l.wv}, false);
    p.wo = prepare({&l.wo}, false);
    p.gate_up = prepare({&l.w_gate, &l.w_up}, true);
    p.down = prepare({&l.w_down}, false);
  }
  lm_head_ = prepare({&weights.lm_head}, false);
}

void Transformer::linear(const float* x, int64_t n, const TensorView& w, const Linear& prepared,
                         const float* bias, float* y) {
  const QuantMatmulOutput out{y, w.num_rows(), bias};
  if (prepared.onednn) return prepared.onednn->run(x, n, {&out, 1}, pool_);
  if (!prepared.packed) return matmul(x, n, w, bias, y, pool_);
  packed_matmul(x, n, *prepared.packed, quantized_, {&out, 1}, pool_);
}

void Transformer::norm_and_matmul(const std::vector<float>& norm_weight, const Linear& w,
                                  std::span<const QuantMatmulOutput> outputs, int64_t n) {
  const ModelConfig& c = config();
  const auto eps = static_cast<float>(c.rms_norm_eps);
  if (w.onednn || w.packed->is_float()) {
    for (int64_t t = 0; t < n; ++t)
      rms_norm(&hidden_[t * c.hidden_size], norm_weight.data(), &normed_[t * c.hidden_size], c.hidden_size,
               eps);
    if (w.onednn) return w.onednn->run(normed_.data(), n, outputs, pool_);
    float_matmul(normed_.data(), n, *w.packed, outputs, pool_);
  } else {
    quantized_.quantize_rms_norm(hidden_.data(), norm_weight.data(), eps, n, c.hidden_size);
    quant_matmul(quantized_, *w.packed, outputs, pool_);
  }
}

void Transformer::reserve(int64_t n) {
  if (n <= capacity_) return;
  const ModelConfig& c = config();
  auto grow = [n](std::vector<float>& v, int64_t width) { v.resize(static_cast<size_t>(n * width)); };
  grow(hidden_, c.hidden_size);
  grow(normed_, c.hidden_size);
  grow(q_, c.q_dim());
  grow(k_, c.kv_dim());
  grow(v_, c.kv_dim());
  grow(attn_, c.q_dim());
  grow(gate_, c.intermediate_size);
  grow(up_, c.intermediate_size);
  grow(proj_, c.hidden_size);
  capacity_ = n;
}

Status Transformer::validate(const ForwardBatch& b, const KvCache& cache, size_t logits_size) const {
  const ModelConfig& c = config();
  const size_t n = b.token_ids.size();
  if (b.positions.size() != n || b.slot_mapping.size() != n || b.token_sequence.size() != n) {
    return invalid_argument("batch arrays differ in length");
  }
  if (logits_size < b.logit_rows.size() * static_cast<size_t>(c.vocab_size)) {
    return invalid_argument("logits buffer too small");
  }
  if (cache.num_layers() != c.num_layers || cache.kv_dim() != c.kv_dim()) {
    return invalid_argument("KV cache shape does not match the model");
  }
  for (size_t t = 0; t < n; ++t) {
    if (b.token_ids[t] < 0 || b.token_ids[t] >= c.vocab_size) {
      return invalid_argument("token id " + std::to_string(b.token_ids[t]) +
                              " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
    if (b.slot_mapping[t] < 0 || b.slot_mapping[t] >= cache.num_slots()) {
      return invalid_argument("KV slot " + std::to_string(b.slot_mapping[t]) + " is outside the cache");
    }
    if (b.token_sequence[t] < 0 || static_cast<size_t>(b.token_sequence[t]) >= b.sequences.size()) {
      return invalid_argument("token " + std::to_string(t) + " names no sequence");
    }
    const AttentionSequence& s = b.sequences[static_cast<size_t>(b.token_sequence[t])];
    const auto row = static_cast<int64_t>(t);
    if (row < s.query_start || row >= s.query_start + s.num_queries ||
        b.positions[t] != s.context_len - s.num_queries + (row - s.query_start)) {
      return invalid_argument("token " + std::to_string(t) + " position disagrees with its sequence");
    }
  }
  for (const AttentionSequence& s : b.sequences) {
    if (s.num_queries < 1 || s.context_len < s.num_queries || s.query_start < 0 ||
        s.query_start + s.num_queries > static_cast<int64_t>(n)) {
      return invalid_argument("sequence query range is inconsistent");
    }
    const int64_t blocks_needed = (s.context_len + cache.block_size() - 1) / cache.block_size();
    if (static_cast<int64_t>(s.block_table.size()) < blocks_needed) {
      return invalid_argument("block table shorter than the context");
    }
    for (int64_t i = 0; i < blocks_needed; ++i) {
      const int32_t block = s.block_table[static_cast<size_t>(i)];
      if (block < 0 || block >= cache.num_blocks()) return invalid_argument("block id outside the cache");
    }
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || static_cast<size_t>(r) >= n) return invalid_argument("logit row outside the batch");
  }
  return Status::ok();
}

void Transformer::embed(const ForwardBatch& b) {
  const int64_t h = config().hidden_size;
  const TensorView& e = weights_.token_embedding;
  for (size_t t = 0; t < b.token_ids.size(); ++t) {
    dequantize_tensor_row(e, b.token_ids[t], hidden_.data() + static_cast<int64_t>(t) * h);
  }
}

void Transformer::attention_block(const LayerWeights& l, int64_t layer_index, const ForwardBatch& b,
                                  KvCache& cache) {
  const ModelConfig& c = config();
  const auto n = static_cast<int64_t>(b.token_ids.size());
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const int64_t hd = c.head_dim;
  auto bias = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
  const PackedLayer& p = packed_[static_cast<size_t>(layer_index)];
  if (p.qkv.prepared()) {
    const QuantMatmulOutput out[3] = {{q_.data(), c.q_dim(), bias(l.bq)},
                                      {k_.data(), c.kv_dim(), bias(l.bk)},
                                      {v_.data(), c.kv_dim(), bias(l.bv)}};
    norm_and_matmul(l.attn_norm, p.qkv, out, n);
  } else {
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(&hidden_[t * c.hidden_size], l.attn_norm.data(), &normed_[t * c.hidden_size], c.hidden_size,
               eps);
    }
    if (observer_ != nullptr)
      observer_->observe(layer_index, LinearInput::kAttention, normed_.data(), n, c.hidden_size);
    matmul(normed_.data(), n, l.wq, bias(l.bq), q_.data(), pool_);
    matmul(normed_.data(), n, l.wk, bias(l.bk), k_.data(), pool_);
    matmul(normed_.data(), n, l.wv, bias(l.bv), v_.data(), pool_);
  }
  for (int64_t t = 0; t < n; ++t) {
    float* q = &q_[t * c.q_dim()];
    float* k = &k_[t * c.kv_dim()];
    if (c.qk_norm) {
      for (int64_t h = 0; h < c.num_heads; ++h) rms_norm(q + h * hd, l.q_norm.data(), q + h * hd, hd, eps);
      for (int64_t h = 0; h < c.num_kv_heads; ++h) rms_norm(k + h * hd, l.k_norm.data(), k + h * hd, hd, eps);
    }
    const int64_t pos = b.positions[static_cast<size_t>(t)];
    rope_qk(q, c.num_heads, k, c.num_kv_heads, hd, pos, inv_freq_.data(), c.rope_pairing);
    const int64_t slot = b.slot_mapping[static_cast<size_t>(t)];
    cache.write(layer_index, slot, k, &v_[t * c.kv_dim()]);
  }
  const AttentionShape shape{c.num_heads, c.num_kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  paged_attention(q_.data(), b.sequences, b.token_sequence, cache.layer_view(layer_index), shape,
                  attn_.data(), pool_);
  if (observer_ != nullptr && !p.wo.prepared())
    observer_->observe(layer_index, LinearInput::kOutput, attn_.data(), n, c.q_dim());
  linear(attn_.data(), n, l.wo, p.wo, nullptr, proj_.data());
  for (int64_t i = 0; i < n * c.hidden_size; ++i)
    hidden_[static_cast<size_t>(i)] += proj_[static_cast<size_t>(i)];
}

void Transformer::mlp_block(const LayerWeights& l, int64_t layer, const PackedLayer& p, int64_t n) {
  const ModelConfig& c = config();
  const auto eps = static_cast<float>(c.rms_norm_eps);
  if (p.gate_up.prepared()) {
    // gate_ = silu(x gate^T) * (x up^T) in one pass over both matrices.
    const QuantMatmulOutput out{gate_.data(), c.intermediate_size, nullptr};
    norm_and_matmul(l.ffn_norm, p.gate_up, {&out, 1}, n);
  } else {
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(&hidden_[t * c.hidden_size], l.ffn_norm.data(), &normed_[t * c.hidden_size], c.hidden_size,
               eps);
    }
    if (observer_ != nullptr) observer_->observe(layer, LinearInput::kMlp, normed_.data(), n, c.hidden_size);
    matmul(normed_.data(), n, l.w_gate, nullptr, gate_.data(), pool_);
    matmul(normed_.data(), n, l.w_up, nullptr, up_.data(), pool_);
    silu_mul(gate_.data(), up_.data(), gate_.data(), n * c.intermediate_size);
  }
  if (observer_ != nullptr && !p.down.prepared())
    observer_->observe(layer, LinearInput::kDown, gate_.data(), n, c.intermediate_size);
  linear(gate_.data(), n, l.w_down, p.down, nullptr, proj_.data());
  for (int64_t i = 0; i < n * c.hidden_size; ++i)
    hidden_[static_cast<size_t>(i)] += proj_[static_cast<size_t>(i)];
}

Status Transformer::forward(const ForwardBatch& b, KvCache& cache, std::span<float> logits) {
  INFERD_RETURN_IF_ERROR(validate(b, cache, logits.size()));
  const ModelConfig& c = config();
  const auto n = static_cast<int64_t>(b.token_ids.size());
  if (n == 0) return Status::ok();
  reserve(n);
  embed(b);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = weights_.layers[static_cast<size_t>(i)];
    attention_block(l, i, b, cache);
    mlp_block(l, i, packed_[static_cast<size_t>(i)], n);
  }
  // Final norm of the rows that want logits, gathered to the front of normed_.
  const auto num_rows = static_cast<int64_t>(b.logit_rows.size());
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t t = b.logit_rows[static_cast<size_t>(r)];
    rms_norm(&hidden_[t * c.hidden_size], weights_.final_norm.data(), &normed_[r * c.hidden_size],
             c.hidden_size, static_cast<float>(c.rms_norm_eps));
  }
  linear(normed_.data(), num_rows, weights_.lm_head, lm_head_, nullptr, logits.data());
  return Status::ok();
}

}  // namespace inferd
