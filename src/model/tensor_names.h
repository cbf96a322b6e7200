// The names of a model's per-layer tensors in GGUF's naming ("blk.3.ffn_up.weight") and in
// Hugging Face's ("model.layers.3.mlp.up_proj.weight"): one table for the loader, the GGUF
// converter and GPTQ. Mixture-of-experts layers add the router, the shared expert and the routed
// experts, whose layout differs between the formats (expert_tensor_names below).
#pragma once

#include <cstdint>
#include <string>

namespace inferd {

enum class LayerTensor {
  kAttnNorm,
  kWq,
  kWk,
  kWv,
  kWo,
  kBq,
  kBk,
  kBv,
  kQNorm,
  kKNorm,
  kFfnNorm,
  kGate,
  kUp,
  kDown,
  kRouter,            // [num_experts, hidden]
  kSharedExpertGate,  // [1, hidden]: sigmoid(x . g) scales the shared expert
  kSharedGate,        // [shared_intermediate, hidden]
  kSharedUp,          // [shared_intermediate, hidden]
  kSharedDown,        // [hidden, shared_intermediate]
};

// One of a routed expert's three weights.
enum class ExpertTensor { kGate, kUp, kDown };

std::string gguf_layer_tensor(LayerTensor role, int64_t layer);
std::string hf_layer_tensor(LayerTensor role, int64_t layer);

// The layer and role of a per-layer tensor named either way; false for any other name.
bool parse_layer_tensor(const std::string& name, int64_t* layer, LayerTensor* role);

// A layer's routed experts, stored three ways:
//   GGUF: stacked, one tensor per weight: blk.3.ffn_gate_exps.weight [num_experts, rows, cols]
//   Hugging Face checkpoints: one tensor per expert: model.layers.3.mlp.experts.5.gate_proj.weight
//   transformers 5 in memory (save_pretrained(save_original_format=False)): fused,
//     model.layers.3.mlp.experts.gate_up_proj [num_experts, 2 * moe_intermediate, hidden] (gate
//     rows first, then up) and model.layers.3.mlp.experts.down_proj [num_experts, hidden, moe_intermediate]
std::string gguf_experts_tensor(ExpertTensor role, int64_t layer);
std::string hf_expert_tensor(ExpertTensor role, int64_t layer, int64_t expert);
std::string hf_fused_experts_tensor(ExpertTensor role, int64_t layer);  // kGate and kUp: gate_up_proj

}  // namespace inferd
