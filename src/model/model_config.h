// ModelConfig: the hyper-parameters of a decoder-only transformer, read from GGUF metadata or a
// Hugging Face config.json and validated once. The transformer and the KV cache are sized by it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/ops.h"
#include "kernels/rope_scaling.h"

namespace inferd {

// kQwen2Moe / kQwen3Moe are Qwen2 / Qwen3 attention with mixture-of-experts MLPs.
enum class Architecture { kLlama, kQwen2, kQwen3, kQwen2Moe, kQwen3Moe };

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;  // "llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe" (GGUF's names)
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

  // Mixture of experts (Qwen2-MoE / Qwen3-MoE; all zero for dense models). A MoE layer's MLP is
  // a router [num_experts, hidden] whose softmax picks num_experts_per_tok experts per token
  // (SwiGLU MLPs of moe_intermediate_size), plus on Qwen2-MoE a shared expert of
  // shared_expert_intermediate_size scaled by sigmoid(its gate). Layers listed in
  // mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP of intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool norm_topk_prob = false;                  // renormalize the top-k probabilities to sum 1
  int64_t decoder_sparse_step = 1;              // layer i is MoE when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;         // ... and i is not listed here

  bool is_moe() const { return num_experts > 0; }
  // Whether layer i's MLP is the mixture of experts (transformers' rule).
  bool is_moe_layer(int64_t layer) const;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }

  // Checks that the numbers describe a model inferd can run; names the offending field.
  Status validate() const;
};

// Maps an architecture name ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe") to the enum;
// others are kUnsupported.
Expected<Architecture> architecture_from_name(const std::string& name);

}  // namespace inferd
