#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace inferd {

namespace {

std::unique_ptr<Backend> backend_or_die(BackendKind kind, Isa isa, ThreadPool& pool) {
  auto b = make_backend(kind, isa, pool);
  INFERD_CHECK_MSG(b.has_value(), b.status().message().c_str());
  return std::move(b).value();
}

}  // namespace

Transformer::Transformer(const ModelWeights& weights, ThreadPool& pool, TransformerOptions options)
    : Transformer(weights, backend_or_die(options.backend, options.isa, pool)) {}

Transformer::Transformer(const ModelWeights& weights, std::unique_ptr<Backend> backend)
    : weights_(weights),
      backend_(std::move(backend)),
      rope_(weights.config.head_dim, weights.config.rope_theta, weights.config.rope_scaling) {
  auto prepare = [&](std::initializer_list<const TensorView*> parts, bool swiglu) {
    return backend_->prepare_linear(std::span<const TensorView* const>(parts.begin(), parts.size()), swiglu);
  };
  layers_.resize(weights.layers.size());
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    LayerLinears& p = layers_[i];
    p.qkv = prepare({&l.wq, &l.wk, &l.wv}, false);
    p.wo = prepare({&l.wo}, false);
    if (l.is_moe()) {
      p.moe = std::make_unique<MoeMlp>(l.moe, weights.config, *backend_);
      continue;
    }
    p.gate_up = prepare({&l.w_gate, &l.w_up}, true);
    p.down = prepare({&l.w_down}, false);
  }
  // A pipeline stage other than the last never projects onto the vocabulary.
  if (weights.stage.last()) lm_head_ = prepare({&weights.lm_head}, false);
}

void Transformer::norm_linear(const std::vector<float>& norm_weight, int64_t layer, LinearInput input,
                              const LinearWeights& w, std::span<const LinearOutput> outputs, int64_t n) {
  const ModelConfig& c = config();
  const auto eps = static_cast<float>(c.rms_norm_eps);
  if (observer_ == nullptr)
    return backend_->linear(hidden_.data(), n, c.hidden_size, norm_weight.data(), eps, w, outputs);
  backend_->rms_norm(hidden_.data(), norm_weight.data(), normed_.data(), n, c.hidden_size, eps);
  if (observer_ != nullptr) observer_->observe(layer, input, normed_.data(), n, c.hidden_size);
  backend_->linear(normed_.data(), n, c.hidden_size, nullptr, eps, w, outputs);
}

void Transformer::linear(const float* x, int64_t k, int64_t layer, LinearInput input, const LinearWeights& w,
                         const LinearOutput& out, int64_t n) {
  if (observer_ != nullptr) observer_->observe(layer, input, x, n, k);
  backend_->linear(x, n, k, nullptr, 0.0f, w, {&out, 1});
}

Status Transformer::enable_lora() {
  if (tp_ != nullptr || pp_ != nullptr)
    return unsupported("LoRA adapters are not supported with tensor or pipeline parallelism");
  lora_ = true;
  capacity_ = 0;  // reserve() grows the LoRA buffers too
  return Status::ok();
}

void Transformer::prepare_lora(const ForwardBatch& b) {
  lora_adapters_.clear();
  for (auto& rows : lora_rows_) rows.clear();
  lora_mlp_rows_.clear();
  plain_mlp_rows_.clear();
  if (b.sequence_lora.empty()) return;
  for (size_t t = 0; t < b.token_sequence.size(); ++t) {
    const LoraAdapter* a = b.sequence_lora[static_cast<size_t>(b.token_sequence[t])];
    if (a == nullptr) continue;
    size_t i = 0;
    while (i < lora_adapters_.size() && lora_adapters_[i] != a) ++i;
    if (i == lora_adapters_.size()) {
      lora_adapters_.push_back(a);
      if (lora_rows_.size() < lora_adapters_.size()) lora_rows_.emplace_back();
    }
    lora_rows_[i].push_back(static_cast<int32_t>(t));
  }
  if (lora_adapters_.empty()) return;
  // The MLP's gate and up: the rows of adapters that change either, adapter after adapter (each
  // adapter's rows a contiguous range of the gathered rows), and the others.
  if (lora_mlp_local_.size() < lora_adapters_.size()) lora_mlp_local_.resize(lora_adapters_.size());
  for (size_t i = 0; i < lora_adapters_.size(); ++i) {
    lora_mlp_local_[i].clear();
    const auto& tg = lora_adapters_[i]->targets;
    if (!tg[static_cast<size_t>(LoraTarget::kGate)] && !tg[static_cast<size_t>(LoraTarget::kUp)]) continue;
    for (const int32_t t : lora_rows_[i]) {
      lora_mlp_local_[i].push_back(static_cast<int32_t>(lora_mlp_rows_.size()));
      lora_mlp_rows_.push_back(t);
    }
  }
  if (lora_mlp_rows_.empty()) return;
  std::vector<bool>& in_lora = lora_row_flag_;
  in_lora.assign(b.token_sequence.size(), false);
  for (const int32_t t : lora_mlp_rows_) in_lora[static_cast<size_t>(t)] = true;
  for (size_t t = 0; t < in_lora.size(); ++t)
    if (!in_lora[t]) plain_mlp_rows_.push_back(static_cast<int32_t>(t));
}

void Transformer::apply_lora(int64_t layer, std::span<const LoraTargetOutput> targets, const float* x,
                             int64_t k, bool gathered) {
  LoraOutput outputs[kNumLoraTargets];
  size_t count = 0;
  for (const LoraTargetOutput& t : targets) {
    std::vector<LoraGroup>& groups = lora_groups_[static_cast<size_t>(t.target)];
    groups.clear();
    for (size_t i = 0; i < lora_adapters_.size(); ++i) {
      const LoraMatrix& m = lora_adapters_[i]->matrix(layer, t.target);
      if (m.rank == 0) continue;
      groups.push_back(LoraGroup{m.a_data(), m.bt_data(), m.dtype, m.rank, m.scale,
                                 gathered ? lora_mlp_local_[i] : lora_rows_[i]});
    }
    if (!groups.empty()) outputs[count++] = LoraOutput{groups, t.y, t.n, t.n};
  }
  if (count > 0) backend_->lora_update(x, k, k, {outputs, count});
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
  if (lora_) {
    grow(lora_x_, c.hidden_size);
    grow(lora_gate_, c.intermediate_size);
    grow(lora_up_, c.intermediate_size);
  }
  grow(proj_, c.hidden_size);
  if (c.rope_scaling.type == RopeScalingType::kDynamic) grow(own_inv_freq_, rope_.size());
  token_inv_freq_.resize(static_cast<size_t>(n));
  grow(token_cos_sin_, n * c.head_dim);
  capacity_ = n;
}

void Transformer::prepare_rope(std::span<const int32_t> positions) {
  for (size_t t = 0; t < positions.size(); ++t) {
    if (!rope_.position_dependent(positions[t])) {
      token_inv_freq_[t] = rope_.shared();
      continue;
    }
    float* row = &own_inv_freq_[t * static_cast<size_t>(rope_.size())];
    rope_.compute(positions[t], row);
    token_inv_freq_[t] = row;
  }
  // Each token's rotation, once for every layer (each row alone: the same bits however split).
  const int64_t hd = config().head_dim;
  const auto n = static_cast<int64_t>(positions.size());
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      rope_cos_sin(positions[static_cast<size_t>(t)], token_inv_freq_[static_cast<size_t>(t)], hd,
                   rope_.attention_factor(), &token_cos_sin_[static_cast<size_t>(t * hd)]);
  };
  for_rows(backend_->row_pool(), n, rows);
}

Status Transformer::validate(const ForwardBatch& b, const KvCache& cache, size_t logits_size,
                             size_t hidden_size) const {
  const ModelConfig& c = config();
  const size_t n = b.token_ids.size();
  if (b.positions.size() != n || b.slot_mapping.size() != n || b.token_sequence.size() != n) {
    return invalid_argument("batch arrays differ in length");
  }
  if (!b.sequence_lora.empty() && (!lora_ || b.sequence_lora.size() != b.sequences.size()))
    return invalid_argument(lora_ ? "sequence_lora differs in length from sequences"
                                  : "a batch with LoRA adapters on a transformer without enable_lora()");
  const bool writes_logits = (tp_ == nullptr || tp_->rank() == 0) && (pp_ == nullptr || pp_->stage() == 0);
  if (writes_logits && logits_size < b.logit_rows.size() * static_cast<size_t>(c.vocab_size)) {
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
    if (s.window != 0 || s.sink_len != 0 || s.evicted != 0) {
      if (s.window < kWindowGranule) return invalid_argument("attention window shorter than 16 positions");
      if (s.sink_len < 0 || s.sink_len % kWindowGranule != 0 || s.evicted < 0 ||
          s.evicted % kWindowGranule != 0)
        return invalid_argument("attention sink and evicted positions must be multiples of 16");
      if (s.evicted > 0 && s.sink_len + s.evicted > window_start(s, s.context_len - s.num_queries))
        return invalid_argument("evicted positions inside a query's attention window");
    }
    const int64_t blocks_needed = (s.context_len - s.evicted + cache.block_size() - 1) / cache.block_size();
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
  if (!b.hidden_rows.empty()) {
    if (pp_ != nullptr) return unsupported("hidden states are not returned with pipeline parallelism");
    if (writes_logits && hidden_size < b.hidden_rows.size() * static_cast<size_t>(c.hidden_size))
      return invalid_argument("hidden-state buffer too small");
    for (int32_t r : b.hidden_rows) {
      if (r < 0 || static_cast<size_t>(r) >= n) return invalid_argument("hidden row outside the batch");
    }
  }
  return Status::ok();
}

Status Transformer::set_tensor_parallel(TensorParallelGroup* group) {
  if (lora_ && group != nullptr && !(group->size() == 1))
    return unsupported("LoRA adapters are not supported with tensor or pipeline parallelism");
  if (group == nullptr || group->size() == 1) {
    tp_ = nullptr;
    return Status::ok();
  }
  const TensorShard& s = weights_.shard;
  if (s.size != group->size() || s.rank != group->rank()) {
    return invalid_argument("tensor parallel: the weights are split for rank " + std::to_string(s.rank) +
                            " of " + std::to_string(s.size) + ", the group is rank " +
                            std::to_string(group->rank()) + " of " + std::to_string(group->size()));
  }
  tp_ = group;
  tp_vocab_begin_.clear();
  tp_vocab_count_.clear();
  for (int r = 0; r < s.size; ++r) {
    const auto [begin, end] = tensor_shard_vocab_range(config().vocab_size, r, s.size);
    tp_vocab_begin_.push_back(begin);
    tp_vocab_count_.push_back(end - begin);
  }
  tp_counts_.assign(static_cast<size_t>(s.size), 0);
  return Status::ok();
}

Status Transformer::set_pipeline(PipelineGroup* group) {
  if (lora_ && group != nullptr && !(group->stages() == 1))
    return unsupported("LoRA adapters are not supported with tensor or pipeline parallelism");
  if (group == nullptr || group->stages() == 1) {
    pp_ = nullptr;
    return Status::ok();
  }
  const PipelineStage& s = weights_.stage;
  if (s.stages != group->stages() || s.stage != group->stage()) {
    return invalid_argument("pipeline parallel: the weights are split for stage " + std::to_string(s.stage) +
                            " of " + std::to_string(s.stages) + ", the group is stage " +
                            std::to_string(group->stage()) + " of " + std::to_string(group->stages()));
  }
  pp_ = group;
  return Status::ok();
}

Status Transformer::reduce_proj(int64_t n) {
  if (tp_ == nullptr) return Status::ok();
  return tp_->all_reduce_sum(std::span<float>(proj_.data(), static_cast<size_t>(n * config().hidden_size)));
}

Status Transformer::vocab_projection(int64_t num_rows, std::span<float> logits) {
  const ModelConfig& c = config();
  if (tp_ == nullptr) {
    const LinearOutput out{logits.data(), c.vocab_size, nullptr};
    backend_->linear(normed_.data(), num_rows, c.hidden_size, nullptr, 0.0f, *lm_head_, {&out, 1});
    return Status::ok();
  }
  const int64_t local = weights_.lm_head.num_rows();
  if (tp_local_logits_.size() < static_cast<size_t>(num_rows * local))
    tp_local_logits_.resize(static_cast<size_t>(num_rows * local));
  const LinearOutput out{tp_local_logits_.data(), local, nullptr};
  backend_->linear(normed_.data(), num_rows, c.hidden_size, nullptr, 0.0f, *lm_head_, {&out, 1});
  for (size_t r = 0; r < tp_counts_.size(); ++r) tp_counts_[r] = num_rows * tp_vocab_count_[r];
  if (tp_gathered_.size() < static_cast<size_t>(num_rows * c.vocab_size))
    tp_gathered_.resize(static_cast<size_t>(num_rows * c.vocab_size));
  INFERD_RETURN_IF_ERROR(
      tp_->gather(std::span<const float>(tp_local_logits_.data(), static_cast<size_t>(num_rows * local)),
                  tp_counts_, tp_gathered_));
  if (tp_->rank() != 0) return Status::ok();
  // Rank r's block is [num_rows, count_r]: each row's piece goes to its columns of the logits.
  const float* src = tp_gathered_.data();
  for (size_t r = 0; r < tp_counts_.size(); ++r) {
    const int64_t count = tp_vocab_count_[r];
    for (int64_t row = 0; row < num_rows; ++row, src += count)
      std::copy(src, src + count, logits.data() + row * c.vocab_size + tp_vocab_begin_[r]);
  }
  return Status::ok();
}

Status Transformer::attention_block(const LayerWeights& l, int64_t layer_index, const ForwardBatch& b,
                                    KvCache& cache) {
  const ModelConfig& c = config();
  const auto n = static_cast<int64_t>(b.token_ids.size());
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const int64_t hd = c.head_dim;
  auto bias = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
  const LayerLinears& p = layers_[static_cast<size_t>(layer_index)];
  const LinearOutput qkv[3] = {{q_.data(), c.q_dim(), bias(l.bq)},
                               {k_.data(), c.kv_dim(), bias(l.bk)},
                               {v_.data(), c.kv_dim(), bias(l.bv)}};
  norm_linear(l.attn_norm, layer_index, LinearInput::kAttention, *p.qkv, qkv, n);
  if (!lora_adapters_.empty()) {
    // The updates' input: the normed rows (the fused path above never writes them out).
    backend_->rms_norm(hidden_.data(), l.attn_norm.data(), normed_.data(), n, c.hidden_size, eps);
    const LoraTargetOutput targets[3] = {{LoraTarget::kQ, q_.data(), c.q_dim()},
                                         {LoraTarget::kK, k_.data(), c.kv_dim()},
                                         {LoraTarget::kV, v_.data(), c.kv_dim()}};
    apply_lora(layer_index, targets, normed_.data(), c.hidden_size);
  }
  const bool windowed = std::any_of(b.sequences.begin(), b.sequences.end(),
                                    [](const AttentionSequence& s) { return s.window > 0; });
  if (windowed && sink_q_.size() < static_cast<size_t>(n * c.q_dim()))
    sink_q_.resize(static_cast<size_t>(n * c.q_dim()));
  // Each token's Q/K norms, rotation and KV write touch only its own rows and slot: a prompt's
  // tokens split over the pool where the backend allows it (the same bits either way).
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* q = &q_[t * c.q_dim()];
      float* k = &k_[t * c.kv_dim()];
      if (c.qk_norm) {
        backend_->rms_norm(q, l.q_norm.data(), q, c.num_heads, hd, eps);
        backend_->rms_norm(k, l.k_norm.data(), k, c.num_kv_heads, hd, eps);
      }
      const int64_t pos = b.positions[static_cast<size_t>(t)];
      const AttentionSequence& seq =
          b.sequences[static_cast<size_t>(b.token_sequence[static_cast<size_t>(t)])];
      if (seq.window > 0) {  // the sink's query: rotated at the position StreamingLLM gives the token
        float* sq = &sink_q_[static_cast<size_t>(t * c.q_dim())];
        std::copy_n(q, c.q_dim(), sq);
        backend_->rope_qk(sq, c.num_heads, nullptr, 0, hd, pos - sink_gap(seq, pos),
                          token_inv_freq_[static_cast<size_t>(t)], c.rope_pairing, rope_.attention_factor(),
                          nullptr);
      }
      backend_->rope_qk(q, c.num_heads, k, c.num_kv_heads, hd, pos, token_inv_freq_[static_cast<size_t>(t)],
                        c.rope_pairing, rope_.attention_factor(),
                        &token_cos_sin_[static_cast<size_t>(t * hd)]);
      cache.write(layer_index, b.slot_mapping[static_cast<size_t>(t)], k, &v_[t * c.kv_dim()]);
    }
  };
  for_rows(backend_->row_pool(), n, rows);
  const AttentionShape shape{c.num_heads, c.num_kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  std::span<const AttentionSequence> sequences = b.sequences;
  if (windowed) {
    attn_sequences_.assign(b.sequences.begin(), b.sequences.end());
    for (AttentionSequence& s : attn_sequences_)
      if (s.window > 0) s.sink_q = &sink_q_[static_cast<size_t>(s.query_start * c.q_dim())];
    sequences = attn_sequences_;
  }
  backend_->attention(q_.data(), sequences, b.token_sequence, cache.layer_view(layer_index), shape,
                      attn_.data());
  linear(attn_.data(), c.q_dim(), layer_index, LinearInput::kOutput, *p.wo,
         {proj_.data(), c.hidden_size, nullptr}, n);
  if (!lora_adapters_.empty()) {
    const LoraTargetOutput o{LoraTarget::kO, proj_.data(), c.hidden_size};
    apply_lora(layer_index, {&o, 1}, attn_.data(), c.q_dim());
  }
  INFERD_RETURN_IF_ERROR(reduce_proj(n));
  for (int64_t i = 0; i < n * c.hidden_size; ++i)
    hidden_[static_cast<size_t>(i)] += proj_[static_cast<size_t>(i)];
  return Status::ok();
}

void Transformer::lora_gate_up(const LayerWeights& l, int64_t layer, int64_t n) {
  // Rows of adapters that change gate or up: gate and up as two outputs of the same SwiGLU
  // weight, each with its update, then silu(gate) * up. Every other row takes the fused path it
  // takes without LoRA. A row's path depends on its own adapter alone: batch-invariant.
  const ModelConfig& c = config();
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const LayerLinears& p = layers_[static_cast<size_t>(layer)];
  backend_->rms_norm(hidden_.data(), l.ffn_norm.data(), normed_.data(), n, h, eps);
  if (observer_ != nullptr) observer_->observe(layer, LinearInput::kMlp, normed_.data(), n, h);
  const auto m = static_cast<int64_t>(lora_mlp_rows_.size());
  for (int64_t i = 0; i < m; ++i)
    std::copy_n(&normed_[static_cast<size_t>(lora_mlp_rows_[static_cast<size_t>(i)] * h)], h,
                &lora_x_[i * h]);
  const LinearOutput raw[2] = {{lora_gate_.data(), inter, nullptr}, {lora_up_.data(), inter, nullptr}};
  backend_->linear(lora_x_.data(), m, h, nullptr, eps, *p.gate_up, raw);
  const LoraTargetOutput targets[2] = {{LoraTarget::kGate, lora_gate_.data(), inter},
                                       {LoraTarget::kUp, lora_up_.data(), inter}};
  apply_lora(layer, targets, lora_x_.data(), h, /*gathered=*/true);
  backend_->lora_silu_mul(lora_gate_.data(), lora_up_.data(), lora_gate_.data(), m * inter);
  for (int64_t i = 0; i < m; ++i)
    std::copy_n(&lora_gate_[i * inter], inter,
                &gate_[static_cast<size_t>(lora_mlp_rows_[static_cast<size_t>(i)] * inter)]);
  const auto rest = static_cast<int64_t>(plain_mlp_rows_.size());
  if (rest == 0) return;
  for (int64_t i = 0; i < rest; ++i)
    std::copy_n(&hidden_[static_cast<size_t>(plain_mlp_rows_[static_cast<size_t>(i)] * h)], h,
                &lora_x_[i * h]);
  const LinearOutput fused{lora_gate_.data(), inter, nullptr};
  backend_->linear(lora_x_.data(), rest, h, l.ffn_norm.data(), eps, *p.gate_up, {&fused, 1});
  for (int64_t i = 0; i < rest; ++i)
    std::copy_n(&lora_gate_[i * inter], inter,
                &gate_[static_cast<size_t>(plain_mlp_rows_[static_cast<size_t>(i)] * inter)]);
}

Status Transformer::mlp_block(const LayerWeights& l, int64_t layer, int64_t n) {
  const ModelConfig& c = config();
  const LayerLinears& p = layers_[static_cast<size_t>(layer)];
  if (p.moe != nullptr) {
    backend_->rms_norm(hidden_.data(), l.ffn_norm.data(), normed_.data(), n, c.hidden_size,
                       static_cast<float>(c.rms_norm_eps));
    if (observer_ != nullptr) observer_->observe(layer, LinearInput::kMlp, normed_.data(), n, c.hidden_size);
    p.moe->forward(normed_.data(), n, proj_.data());
    INFERD_RETURN_IF_ERROR(reduce_proj(n));  // tensor parallel: each rank's experts hold a slice
    for (int64_t i = 0; i < n * c.hidden_size; ++i)
      hidden_[static_cast<size_t>(i)] += proj_[static_cast<size_t>(i)];
    return Status::ok();
  }
  // gate_ = silu(x gate^T) * (x up^T) in one pass over both matrices where the backend can.
  const LinearOutput gate{gate_.data(), c.intermediate_size, nullptr};
  if (lora_mlp_rows_.empty()) {
    norm_linear(l.ffn_norm, layer, LinearInput::kMlp, *p.gate_up, {&gate, 1}, n);
  } else {
    lora_gate_up(l, layer, n);
  }
  linear(gate_.data(), c.intermediate_size, layer, LinearInput::kDown, *p.down,
         {proj_.data(), c.hidden_size, nullptr}, n);
  if (!lora_adapters_.empty()) {
    const LoraTargetOutput down{LoraTarget::kDown, proj_.data(), c.hidden_size};
    apply_lora(layer, {&down, 1}, gate_.data(), c.intermediate_size);
  }
  INFERD_RETURN_IF_ERROR(reduce_proj(n));
  for (int64_t i = 0; i < n * c.hidden_size; ++i)
    hidden_[static_cast<size_t>(i)] += proj_[static_cast<size_t>(i)];
  return Status::ok();
}

void Transformer::micro_batch(const ForwardBatch& b, int64_t t0, int64_t t1, ForwardBatch* out) {
  const auto s0 = static_cast<size_t>(b.token_sequence[static_cast<size_t>(t0)]);
  const auto s1 = static_cast<size_t>(b.token_sequence[static_cast<size_t>(t1 - 1)]);
  mb_sequences_.clear();
  for (size_t s = s0; s <= s1; ++s) {
    const AttentionSequence& a = b.sequences[s];
    const int64_t lo = std::max(a.query_start, t0), hi = std::min(a.query_start + a.num_queries, t1);
    AttentionSequence part = a;
    part.query_start = lo - t0;
    part.num_queries = hi - lo;
    part.context_len = a.context_len - (a.query_start + a.num_queries - hi);  // its later rows: not yet
    mb_sequences_.push_back(part);
  }
  mb_token_sequence_.resize(static_cast<size_t>(t1 - t0));
  for (int64_t t = t0; t < t1; ++t)
    mb_token_sequence_[static_cast<size_t>(t - t0)] =
        b.token_sequence[static_cast<size_t>(t)] - static_cast<int32_t>(s0);
  mb_logit_rows_.clear();
  for (int32_t r : b.logit_rows) {
    if (r >= t0 && r < t1) mb_logit_rows_.push_back(static_cast<int32_t>(r - t0));
  }
  const auto o = static_cast<size_t>(t0), len = static_cast<size_t>(t1 - t0);
  *out = ForwardBatch{b.token_ids.subspan(o, len),
                      b.positions.subspan(o, len),
                      b.slot_mapping.subspan(o, len),
                      mb_token_sequence_,
                      mb_sequences_,
                      mb_logit_rows_};
}

// Micro-batches of at least this many tokens: a decode step of a few sequences goes through the
// stages whole (a micro-batch rereads the stage's weights: splitting a bandwidth-bound step
// only adds reads), a prefill chunk in several pieces that overlap across the stages.
constexpr int64_t kMinMicroBatchTokens = 32;

Status Transformer::forward_pipeline(const ForwardBatch& b, KvCache& cache, std::span<float> logits) {
  const ModelConfig& c = config();
  const PipelineStage& st = weights_.stage;
  const auto n = static_cast<int64_t>(b.token_ids.size());
  const int64_t h = c.hidden_size;
  reserve(n);
  if (pp_out_.size() < static_cast<size_t>(n * h)) pp_out_.resize(static_cast<size_t>(n * h));
  const size_t rows = b.logit_rows.size();
  if (st.last() && pp_logits_.size() < rows * static_cast<size_t>(c.vocab_size))
    pp_logits_.resize(rows * static_cast<size_t>(c.vocab_size));
  // Rows laid out sequence after sequence (as the scheduler builds batches) can be cut anywhere;
  // any other layout goes through whole. Every stage cuts the same batch the same way (this
  // depends on the batch alone), so the tags match.
  bool in_order = true;
  int64_t next_row = 0;
  for (const AttentionSequence& s : b.sequences) {
    in_order = in_order && s.query_start == next_row;
    next_row += s.num_queries;
  }
  in_order = in_order && next_row == n;
  const MicroBatchPlan plan =
      plan_micro_batches(n, in_order ? kMinMicroBatchTokens : n + 1, 4 * int64_t{st.stages});
  ForwardBatch mb = b;
  int64_t logit_offset = 0;  // rows of the logits sent so far (last stage) / received (stage 0)
  for (int64_t m = 0; m < plan.count; ++m) {
    const int64_t t0 = plan.bounds[m], t1 = plan.bounds[m + 1], nm = t1 - t0;
    if (plan.count > 1) micro_batch(b, t0, t1, &mb);
    const auto tag = static_cast<int>(m);
    if (st.first()) {
      backend_->embed(weights_.token_embedding, mb.token_ids, hidden_.data());
    } else {
      INFERD_RETURN_IF_ERROR(
          pp_->receive(st.stage - 1, tag, std::span<float>(hidden_.data(), static_cast<size_t>(nm * h))));
    }
    prepare_rope(mb.positions);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const LayerWeights& l = weights_.layers[static_cast<size_t>(i)];
      INFERD_RETURN_IF_ERROR(attention_block(l, i, mb, cache));
      INFERD_RETURN_IF_ERROR(mlp_block(l, i, nm));
    }
    if (!st.last()) {
      float* out = pp_out_.data() + t0 * h;
      std::copy(hidden_.data(), hidden_.data() + nm * h, out);
      INFERD_RETURN_IF_ERROR(
          pp_->send(st.stage + 1, tag, std::span<const float>(out, static_cast<size_t>(nm * h))));
      // Waited for at once: a large message moves only while the sender is inside MPI, so a send
      // left pending through the next micro-batch's compute would hold the next stage idle (the
      // stages would take turns instead of overlapping). The next stage is waiting for it.
      INFERD_RETURN_IF_ERROR(pp_->finish_sends());
      continue;
    }
    const auto num_rows = static_cast<int64_t>(mb.logit_rows.size());
    if (num_rows == 0) continue;
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t t = mb.logit_rows[static_cast<size_t>(r)];
      backend_->rms_norm(&hidden_[t * h], weights_.final_norm.data(), &normed_[r * h], 1, h,
                         static_cast<float>(c.rms_norm_eps));
    }
    // With tensor parallelism too, the stage's rank 0 gathers the logits and sends them to the
    // first stage's rank 0 (the scheduler's).
    const std::span<float> dst(pp_logits_.data() + logit_offset * c.vocab_size,
                               static_cast<size_t>(num_rows * c.vocab_size));
    INFERD_RETURN_IF_ERROR(vocab_projection(num_rows, dst));
    if (tp_ == nullptr || tp_->rank() == 0) INFERD_RETURN_IF_ERROR(pp_->send(0, tag, dst));
    logit_offset += num_rows;
  }
  INFERD_RETURN_IF_ERROR(pp_->finish_sends());
  if (!st.first() || (tp_ != nullptr && tp_->rank() != 0)) return Status::ok();
  // Stage 0: each micro-batch's logits, in the order of its logit rows (those rows are the
  // batch's logit_rows within the micro-batch, in their order).
  for (int64_t m = 0; m < plan.count; ++m) {
    const int64_t t0 = plan.bounds[m], t1 = plan.bounds[m + 1];
    int64_t count = 0;
    for (int32_t r : b.logit_rows) count += (r >= t0 && r < t1) ? 1 : 0;
    if (count == 0) continue;
    if (pp_logits_.size() < static_cast<size_t>(count * c.vocab_size))
      pp_logits_.resize(static_cast<size_t>(count * c.vocab_size));
    INFERD_RETURN_IF_ERROR(
        pp_->receive(st.stages - 1, static_cast<int>(m),
                     std::span<float>(pp_logits_.data(), static_cast<size_t>(count * c.vocab_size))));
    int64_t k = 0;
    for (size_t j = 0; j < rows; ++j) {
      const int32_t r = b.logit_rows[j];
      if (r < t0 || r >= t1) continue;
      std::copy(pp_logits_.data() + k * c.vocab_size, pp_logits_.data() + (k + 1) * c.vocab_size,
                logits.data() + static_cast<int64_t>(j) * c.vocab_size);
      ++k;
    }
  }
  return Status::ok();
}

Status Transformer::forward(const ForwardBatch& b, KvCache& cache, std::span<float> logits,
                            std::span<float> hidden) {
  INFERD_RETURN_IF_ERROR(validate(b, cache, logits.size(), hidden.size()));
  if (pp_ != nullptr) {
    if (b.token_ids.empty()) return Status::ok();
    return forward_pipeline(b, cache, logits);
  }
  const ModelConfig& c = config();
  const auto n = static_cast<int64_t>(b.token_ids.size());
  if (n == 0) return Status::ok();
  reserve(n);
  prepare_rope(b.positions);
  prepare_lora(b);
  backend_->embed(weights_.token_embedding, b.token_ids, hidden_.data());
  if (observer_ != nullptr) observer_->observe_hidden(-1, hidden_.data(), n, c.hidden_size);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = weights_.layers[static_cast<size_t>(i)];
    INFERD_RETURN_IF_ERROR(attention_block(l, i, b, cache));
    INFERD_RETURN_IF_ERROR(mlp_block(l, i, n));
    if (observer_ != nullptr) observer_->observe_hidden(i, hidden_.data(), n, c.hidden_size);
  }
  // Final norm of the rows that want their hidden state (every rank has the whole of hidden_).
  if (tp_ == nullptr || tp_->rank() == 0) {
    for (size_t r = 0; r < b.hidden_rows.size(); ++r) {
      const int64_t t = b.hidden_rows[r];
      backend_->rms_norm(&hidden_[t * c.hidden_size], weights_.final_norm.data(),
                         &hidden[r * static_cast<size_t>(c.hidden_size)], 1, c.hidden_size,
                         static_cast<float>(c.rms_norm_eps));
    }
  }
  // Final norm of the rows that want logits, gathered to the front of normed_.
  const auto num_rows = static_cast<int64_t>(b.logit_rows.size());
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t t = b.logit_rows[static_cast<size_t>(r)];
    backend_->rms_norm(&hidden_[t * c.hidden_size], weights_.final_norm.data(), &normed_[r * c.hidden_size],
                       1, c.hidden_size, static_cast<float>(c.rms_norm_eps));
  }
  return vocab_projection(num_rows, logits);
}

}  // namespace inferd
