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
  TensorView w_gate;              // [intermediate, hidden]
  TensorView w_up;                // [intermediate, hidden]
  TensorView w_down;              // [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  std::string source_path;     // the .gguf file or the Hugging Face directory
  std::string source_format;   // "gguf" or "safetensors"
  TensorView token_embedding;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  TensorView lm_head;             // [vocab, hidden]; the embedding itself when tied
  size_t weight_bytes = 0;        // bytes of all weights the model reads

  // Keep the memory maps alive for the views above.
  std::unique_ptr<GgufFile> gguf;  // also holds tokenizer metadata
  std::vector<SafetensorsFile> safetensors;
};

}  // namespace inferd
