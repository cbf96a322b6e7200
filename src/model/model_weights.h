// ModelWeights: a loaded model: its config, weight views (memory-mapped, any DType) and the
// small f32 vectors (norms, biases) copied out at load. Built by model_loader; read by the
// transformer from any thread; immutable after load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/gguf_file.h"
#include "formats/safetensors_file.h"
#include "model/model_config.h"
#include "tensor/tensor_view.h"

namespace inferd {

// A mixture-of-experts MLP: router, routed experts and (Qwen2-MoE) the shared expert.
struct MoeWeights {
  TensorView router;                    // [num_experts, hidden]
  std::vector<TensorView> expert_gate;  // num_experts x [moe_intermediate, hidden]
  std::vector<TensorView> expert_up;    // num_experts x [moe_intermediate, hidden]
  std::vector<TensorView> expert_down;  // num_experts x [hidden, moe_intermediate]
  TensorView shared_gate;               // [shared_intermediate, hidden]; empty without a shared expert
  TensorView shared_up;                 // [shared_intermediate, hidden]
  TensorView shared_down;               // [hidden, shared_intermediate]
  TensorView shared_expert_gate;        // [1, hidden]: the shared expert is scaled by sigmoid(x . g)

  bool has_shared_expert() const { return shared_gate.data != nullptr; }
};

struct LayerWeights {
  std::vector<float> attn_norm;   // [hidden]
  TensorView wq;                  // [q_dim, hidden]
  TensorView wk;                  // [kv_dim, hidden]
  TensorView wv;                  // [kv_dim, hidden]
  TensorView wo;                  // [hidden, q_dim]
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]; empty without attention_bias
  std::vector<float> q_norm;      // [head_dim]; empty without qk_norm
  std::vector<float> k_norm;      // [head_dim]
  std::vector<float> ffn_norm;    // [hidden]
  // Dense MLP (every layer of a dense model; a MoE model's mlp_only_layers).
  TensorView w_gate;  // [intermediate, hidden]
  TensorView w_up;    // [intermediate, hidden]
  TensorView w_down;  // [hidden, intermediate]
  // Mixture of experts (config.is_moe_layer): the dense MLP's views stay empty. Each expert's
  // view is a slice of the file's stacked or fused tensor (named "<tensor>[expert]").
  MoeWeights moe;

  bool is_moe() const { return !moe.expert_gate.empty(); }
};

// What one rank of a tensor-parallel group holds (model/tensor_parallel.h), as half-open ranges
// of the whole model's; a model not split holds everything (size 1).
struct TensorShard {
  int rank = 0;
  int size = 1;
  int64_t kv_head_begin = 0, kv_head_end = 0;            // its KV heads (and their query heads)
  int64_t head_begin = 0, head_end = 0;                  // its query heads
  int64_t inter_begin = 0, inter_end = 0;                // its intermediate channels of the dense MLP
  int64_t moe_inter_begin = 0, moe_inter_end = 0;        // ... of every routed expert (MoE)
  int64_t shared_inter_begin = 0, shared_inter_end = 0;  // ... of the shared expert (Qwen2-MoE)
  int64_t vocab_begin = 0, vocab_end = 0;                // its rows of the vocabulary projection
};

// What one stage of a pipeline-parallel group holds (model/pipeline_parallel.h): layers
// [layer_begin, layer_end) of the whole model's; a model not split is its own single stage.
struct PipelineStage {
  int stage = 0;
  int stages = 1;
  int64_t layer_begin = 0, layer_end = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

struct ModelWeights {
  ModelConfig config;
  std::string source_path;     // the .gguf file or the Hugging Face directory
  std::string source_format;   // "gguf" or "safetensors"
  TensorView token_embedding;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  TensorView lm_head;             // [vocab, hidden]; the embedding itself when tied
  size_t weight_bytes = 0;        // bytes of all weights the model reads (this rank's slice)
  TensorShard shard;              // size 1 unless split by shard_weights
  PipelineStage stage;            // stages 1 unless split by pipeline_weights
  // Column slices of a split model (model/tensor_parallel.cpp): the views above point into them.
  std::vector<std::vector<std::byte>> owned;

  // Keep the memory maps alive for the views above.
  std::unique_ptr<GgufFile> gguf;  // also holds tokenizer metadata
  std::vector<SafetensorsFile> safetensors;
};

}  // namespace inferd
