// ModelConfig: the hyper-parameters of a decoder-only transformer, read from GGUF metadata or a
// Hugging Face config.json and validated once. The transformer and the KV cache are sized by it.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "kernels/ops.h"
#include "kernels/rope_scaling.h"

namespace inferd {

enum class Architecture { kLlama, kQwen2, kQwen3 };

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;  // "llama", "qwen2", "qwen3"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // linear / dynamic / yarn / llama3 frequencies; kNone: plain RoPE
  // kNeox: Hugging Face rotate_half, GGUF qwen2/qwen3. kInterleaved: GGUF llama, whose
  // converter permutes the Q and K rows.
  RopePairing rope_pairing = RopePairing::kNeox;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on the Q, K and V projections (Qwen2)
  bool qk_norm = false;         // RMSNorm on each head's q and k before RoPE (Qwen3)

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }

  // Checks that the numbers describe a model inferd can run; names the offending field.
  Status validate() const;
};

// Maps an architecture name ("llama", "qwen2", "qwen3") to the enum; others are kUnsupported.
Expected<Architecture> architecture_from_name(const std::string& name);

}  // namespace inferd
