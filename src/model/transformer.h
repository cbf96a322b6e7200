// Transformer: the decoder-only forward pass (Llama / Qwen2 / Qwen3, and Qwen2-MoE / Qwen3-MoE
// with mixture-of-experts MLPs: moe_mlp.h) over a flattened batch.
// The model runner hands it a ForwardBatch (tokens of many sequences, concatenated, nothing
// padded) and a KvCache; it writes each new token's K/V and returns logits for chosen rows.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/rope_scaling.h"
#include "kv/kv_cache.h"
#include "model/lora_adapter.h"
#include "model/model_weights.h"
#include "model/moe_mlp.h"
#include "model/pipeline_parallel.h"
#include "model/tensor_parallel.h"

namespace inferd {

// One step's input. Token t (of num_tokens) is token_ids[t] at positions[t] of the sequence
// sequences[token_sequence[t]], and its K/V go to cache slot slot_mapping[t].
//
//   token rows:  | seq 0: prefill chunk (5) | seq 1: decode (1) | seq 2: chunk (3) |
//   query_start:   0                         5                   6
struct ForwardBatch {
  std::span<const int32_t> token_ids;       // [num_tokens]
  std::span<const int32_t> positions;       // [num_tokens]
  std::span<const int64_t> slot_mapping;    // [num_tokens]
  std::span<const int32_t> token_sequence;  // [num_tokens] index into sequences
  std::span<const AttentionSequence> sequences;
  std::span<const int32_t> logit_rows;  // token rows whose logits are wanted
  // [sequences.size()] each sequence's LoRA adapter (null: the base alone), or empty: no
  // adapters in this batch. Needs Transformer::enable_lora.
  std::span<const LoraAdapter* const> sequence_lora;
  // Token rows whose final hidden state (after the model's last norm: what the vocabulary
  // projection reads) is wanted, for embeddings. Not with pipeline parallelism.
  std::span<const int32_t> hidden_rows;
};

// The input of a group of linear layers, for an observer of the f32 path (calibration).
enum class LinearInput {
  kAttention,  // rms_norm(hidden) into Q, K, V
  kOutput,     // the attention output into O
  kMlp,        // rms_norm(hidden) into gate and up (MoE layers: into the router and experts)
  kDown,       // silu(gate) * up into down (dense MLPs only)
};

// Sees each linear layer's input rows (normalized where a norm comes first) during forward.
class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  // x: [tokens, k] row-major, valid during the call.
  virtual void observe(int64_t layer, LinearInput input, const float* x, int64_t tokens, int64_t k) = 0;
  // The residual stream after the embedding (layer -1) and after each layer: [tokens, dim]
  // row-major, valid during the call (what layer pruning measures importance on).
  virtual void observe_hidden(int64_t /*layer*/, const float* /*hidden*/, int64_t /*tokens*/,
                              int64_t /*dim*/) {}
};

struct TransformerOptions {
  BackendKind backend = BackendKind::kPacked;  // kPacked and kF32 are batch-invariant
  Isa isa = active_isa();                      // the CPU path the backend's kernels take
};

class Transformer final {
 public:
  // weights and pool: not owned, must outlive the Transformer. Makes the backend of `options`
  // (callers check it is available: OneDnnWeight::available(); CUDA is not compiled in yet)
  // and prepares every linear layer's weights for it (the packed backends repack them here).
  Transformer(const ModelWeights& weights, ThreadPool& pool, TransformerOptions options = {});
  // The same on a backend the caller made.
  Transformer(const ModelWeights& weights, std::unique_ptr<Backend> backend);

  const ModelConfig& config() const { return weights_.config; }
  const ModelWeights& weights() const { return weights_; }
  const Backend& backend() const { return *backend_; }

  // Runs all layers over the batch; writes K/V of every token; logits: [logit_rows.size(),
  // vocab]; hidden: [hidden_rows.size(), hidden_size] (rank 0 of tensor parallelism). Returns an
  // error (and computes nothing) when the batch is inconsistent: ids out of the vocabulary, slots
  // outside the cache, positions that disagree with the sequences.
  // Engine thread only. Allocates only when the batch is larger than any before.
  Status forward(const ForwardBatch& batch, KvCache& cache, std::span<float> logits,
                 std::span<float> hidden = {});

  // Runs as one rank of `group` (not owned; must outlive the Transformer) on weights split by
  // shard_weights for that rank: forward() then is collective (every rank calls it with the same
  // batch) and only rank 0's logits are written (the others may pass an empty span).
  Status set_tensor_parallel(TensorParallelGroup* group);

  // Runs as one stage of `group` (not owned; must outlive the Transformer) on weights split by
  // pipeline_weights for that stage: forward() then is collective (every stage calls it with the
  // same batch); the step's tokens go through the stages in micro-batches, and only stage 0's
  // logits are written (the others may pass an empty span). With set_tensor_parallel as well, a
  // stage is several ranks (weights by pipeline_weights, then shard_weights): each sends to the
  // next stage's rank of the same tensor rank, and only rank 0 of stage 0 gets logits.
  Status set_pipeline(PipelineGroup* group);

  // Lets batches carry LoRA adapters (ForwardBatch::sequence_lora). Rows of the base compute
  // exactly as without LoRA; a row's result depends on its own adapter alone, never on the other
  // rows of its step. Not with tensor or pipeline parallelism (an error).
  Status enable_lora();
  bool lora_enabled() const { return lora_; }

  // Calls `observer` (not owned; null to stop) with every linear layer's input during forward.
  void set_observer(LinearObserver* observer) { observer_ = observer; }

 private:
  Status validate(const ForwardBatch& batch, const KvCache& cache, size_t logits_size,
                  size_t hidden_size) const;
  Status forward_pipeline(const ForwardBatch& batch, KvCache& cache, std::span<float> logits);
  // Micro-batch rows [t0, t1) of `batch` (rows laid out sequence after sequence) as a batch of
  // its own, in the mb_ members.
  void micro_batch(const ForwardBatch& batch, int64_t t0, int64_t t1, ForwardBatch* out);
  Status attention_block(const LayerWeights& layer, int64_t layer_index, const ForwardBatch& batch,
                         KvCache& cache);
  Status mlp_block(const LayerWeights& layer, int64_t layer_index, int64_t num_tokens);
  // proj_ = the sum of every rank's proj_ (a row-parallel layer's partial results).
  Status reduce_proj(int64_t num_tokens);
  // The logits of the vocabulary projection: rank 0 assembles every rank's rows.
  Status vocab_projection(int64_t num_rows, std::span<float> logits);
  // outputs = rms_norm(hidden_) W (the backend fuses the norm; with an observer it is computed
  // here, so the observer sees the normalized rows).
  void norm_linear(const std::vector<float>& norm_weight, int64_t layer, LinearInput input,
                   const LinearWeights& w, std::span<const LinearOutput> outputs, int64_t num_tokens);
  // out = x W, x: [num_tokens, k].
  void linear(const float* x, int64_t k, int64_t layer, LinearInput input, const LinearWeights& w,
              const LinearOutput& out, int64_t num_tokens);
  void reserve(int64_t num_tokens);
  // Groups the batch's rows by adapter (lora_adapters_, lora_rows_).
  void prepare_lora(const ForwardBatch& batch);
  // One linear layer whose LoRA update apply_lora adds: its output, n values per row.
  struct LoraTargetOutput {
    LoraTarget target;
    float* y;
    int64_t n;
  };
  // y[t] += the update of each target in `layer` (all reading x) for each row t whose sequence
  // has an adapter, in one backend call. `gathered`: x and y hold lora_mlp_rows_ only (in that
  // order).
  void apply_lora(int64_t layer, std::span<const LoraTargetOutput> targets, const float* x, int64_t k,
                  bool gathered = false);
  // gate_ = silu(gate) * up of a step with rows whose adapters change gate or up.
  void lora_gate_up(const LayerWeights& layer, int64_t layer_index, int64_t num_tokens);
  // Points token_inv_freq_ at each token's RoPE frequencies.
  void prepare_rope(std::span<const int32_t> positions);

  struct LayerLinears {
    std::unique_ptr<LinearWeights> qkv;  // Q, K and V as one matmul
    std::unique_ptr<LinearWeights> wo;
    std::unique_ptr<LinearWeights> gate_up;  // gate and up as one SwiGLU matmul
    std::unique_ptr<LinearWeights> down;
    std::unique_ptr<MoeMlp> moe;  // instead of gate_up and down in MoE layers
  };

  const ModelWeights& weights_;
  std::unique_ptr<Backend> backend_;
  RopeFrequencies rope_;
  std::vector<float> token_cos_sin_;          // [T][head_dim] each token's rope_cos_sin, for every layer
  std::vector<const float*> token_inv_freq_;  // [T] each token's frequencies: rope_'s or a row below
  std::vector<float> own_inv_freq_;           // [T, head_dim / 2] tokens with their own (dynamic NTK)
  std::vector<LayerLinears> layers_;
  std::unique_ptr<LinearWeights> lm_head_;
  LinearObserver* observer_ = nullptr;
  bool lora_ = false;
  std::vector<const LoraAdapter*> lora_adapters_;                    // the step's distinct adapters
  std::vector<std::vector<int32_t>> lora_rows_;                      // [adapter] its token rows
  std::array<std::vector<LoraGroup>, kNumLoraTargets> lora_groups_;  // [target] this call's groups
  std::vector<int32_t> lora_mlp_rows_;                               // rows whose adapter changes gate or up
  std::vector<std::vector<int32_t>> lora_mlp_local_;  // [adapter] its rows' places in lora_mlp_rows_
  std::vector<int32_t> plain_mlp_rows_;               // the other rows (when lora_mlp_rows_ is not empty)
  std::vector<bool> lora_row_flag_;
  TensorParallelGroup* tp_ = nullptr;
  std::vector<int64_t> tp_vocab_begin_, tp_vocab_count_;  // [ranks] their rows of lm_head
  std::vector<int64_t> tp_counts_;                        // [ranks] floats each sends to gather
  std::vector<float> tp_local_logits_, tp_gathered_;
  PipelineGroup* pp_ = nullptr;
  std::vector<AttentionSequence> mb_sequences_;
  std::vector<int32_t> mb_token_sequence_, mb_logit_rows_;
  std::vector<float> pp_out_;     // [T, hidden] what this stage sent on, valid until finish_sends
  std::vector<float> pp_logits_;  // [rows, vocab] the last stage's logits, sent to stage 0
  int64_t capacity_ = 0;          // tokens the buffers below hold
  std::vector<float> hidden_;     // [T, hidden] residual stream
  std::vector<float> normed_;     // [T, hidden]
  std::vector<float> q_;          // [T, q_dim]
  std::vector<float> sink_q_;     // [T, q_dim] windowed sequences' queries for their sink
  std::vector<AttentionSequence> attn_sequences_;  // the step's sequences with sink_q set
  std::vector<float> k_;                           // [T, kv_dim]
  std::vector<float> v_;                           // [T, kv_dim]
  std::vector<float> attn_;                        // [T, q_dim]
  std::vector<float> gate_;                        // [T, intermediate]
  std::vector<float> lora_x_;                      // [T, hidden] gathered rows (LoRA only)
  std::vector<float> lora_gate_;                   // [T, intermediate]
  std::vector<float> lora_up_;                     // [T, intermediate]
  std::vector<float> proj_;                        // [T, hidden]
};

}  // namespace inferd
