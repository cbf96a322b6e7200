// Transformer: the decoder-only forward pass (Llama / Qwen2 / Qwen3) over a flattened batch.
// The model runner hands it a ForwardBatch (tokens of many sequences, concatenated, nothing
// padded) and a KvCache; it writes each new token's K/V and returns logits for chosen rows.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/onednn_matmul.h"
#include "kernels/packed_matmul.h"
#include "kv/kv_cache.h"
#include "model/model_weights.h"

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
};

// How the linear layers multiply their weights. kPacked and kF32 are batch-invariant.
enum class MatmulPath {
  // Default: weights repacked at load into 16-row tiles. Block-quantized weights (GGUF Q8_0,
  // Q5_0, Q5_1, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) with activations quantized to int8 per block of
  // 32 and exact integer dot products (VNNI / AVX2), as llama.cpp does; F32 / F16 / BF16
  // weights (where AVX-512 runs them) with f32 fmas on the stored values.
  kPacked,
  // Weights expanded to f32 row by row and multiplied in f32: several times slower; matches an
  // f32 reference run on the dequantized weights to ~1e-5 relative.
  kF32,
  // BF16 weights through oneDNN's GEMM (activations rounded to bf16), the rest as kPacked.
  // Faster prefill on BF16 weights, but a token's result depends on the batch it is in: not
  // batch-invariant. Needs a build with oneDNN (OneDnnWeight::available()).
  kOneDnn,
};

// The input of a group of linear layers, for an observer of the f32 path (calibration).
enum class LinearInput {
  kAttention,  // rms_norm(hidden) into Q, K, V
  kOutput,     // the attention output into O
  kMlp,        // rms_norm(hidden) into gate and up
  kDown,       // silu(gate) * up into down
};

// Sees each linear layer's input rows as the f32 path computes them (MatmulPath::kF32 only).
class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  // x: [tokens, k] row-major, valid during the call.
  virtual void observe(int64_t layer, LinearInput input, const float* x, int64_t tokens, int64_t k) = 0;
};

struct TransformerOptions {
  MatmulPath matmul = MatmulPath::kPacked;
};

class Transformer final {
 public:
  // weights and pool: not owned, must outlive the Transformer. With MatmulPath::kPacked the
  // quantized weights are repacked here (a copy of their bytes).
  Transformer(const ModelWeights& weights, ThreadPool& pool, TransformerOptions options = {});

  const ModelConfig& config() const { return weights_.config; }
  const ModelWeights& weights() const { return weights_; }

  // Runs all layers over the batch; writes K/V of every token; logits: [logit_rows.size(),
  // vocab]. Returns an error (and computes nothing) when the batch is inconsistent: ids out of
  // the vocabulary, slots outside the cache, positions that disagree with the sequences.
  // Engine thread only. Allocates only when the batch is larger than any before.
  Status forward(const ForwardBatch& batch, KvCache& cache, std::span<float> logits);

  // Calls `observer` (not owned; null to stop) with every linear layer's input during forward.
  // Only layers on the f32 path are observed: construct with MatmulPath::kF32 to see them all.
  void set_observer(LinearObserver* observer) { observer_ = observer; }

 private:
  Status validate(const ForwardBatch& batch, const KvCache& cache, size_t logits_size) const;
  void embed(const ForwardBatch& batch);
  void attention_block(const LayerWeights& layer, int64_t layer_index, const ForwardBatch& batch,
                       KvCache& cache);

  void reserve(int64_t num_tokens);
  // A linear layer's weights prepared for a kernel: packed, or for oneDNN; neither: the f32 path.
  struct Linear {
    std::optional<PackedWeight> packed;
    std::optional<OneDnnWeight> onednn;
    bool prepared() const { return packed.has_value() || onednn.has_value(); }
  };
  // y = x w^T (+ bias) through the prepared kernel when there is one, else in f32.
  void linear(const float* x, int64_t num_tokens, const TensorView& w, const Linear& prepared,
              const float* bias, float* y);

  struct PackedLayer {
    Linear qkv;  // Q, K and V as one matmul
    Linear wo;
    Linear gate_up;  // gate and up as one SwiGLU matmul
    Linear down;
  };
  void mlp_block(const LayerWeights& layer, int64_t layer_index, const PackedLayer& packed,
                 int64_t num_tokens);
  // rms_norm(hidden_) times w into outputs (the norm fused with int8 quantization where w is
  // block-quantized).
  void norm_and_matmul(const std::vector<float>& norm_weight, const Linear& w,
                       std::span<const QuantMatmulOutput> outputs, int64_t num_tokens);
  // Prepares parts (or gate and up when swiglu) for the options' path.
  Linear prepare(std::initializer_list<const TensorView*> parts, bool swiglu) const;

  const ModelWeights& weights_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<PackedLayer> packed_;
  MatmulPath path_;
  LinearObserver* observer_ = nullptr;
  Linear lm_head_;
  QuantizedActivations quantized_;  // the current linear layer's input, int8
  int64_t capacity_ = 0;            // tokens the buffers below hold
  std::vector<float> hidden_;       // [T, hidden] residual stream
  std::vector<float> normed_;       // [T, hidden]
  std::vector<float> q_;            // [T, q_dim]
  std::vector<float> k_;            // [T, kv_dim]
  std::vector<float> v_;            // [T, kv_dim]
  std::vector<float> attn_;         // [T, q_dim]
  std::vector<float> gate_;         // [T, intermediate]
  std::vector<float> up_;           // [T, intermediate]
  std::vector<float> proj_;         // [T, hidden]
};

}  // namespace inferd
