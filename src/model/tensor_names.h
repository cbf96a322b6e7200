// The names of a model's per-layer tensors in GGUF's naming ("blk.3.ffn_up.weight") and in
// Hugging Face's ("model.layers.3.mlp.up_proj.weight"): one table for the loader, the GGUF
// converter and GPTQ.
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
  kDown
};

std::string gguf_layer_tensor(LayerTensor role, int64_t layer);
std::string hf_layer_tensor(LayerTensor role, int64_t layer);

// The layer and role of a per-layer tensor named either way; false for any other name.
bool parse_layer_tensor(const std::string& name, int64_t* layer, LayerTensor* role);

}  // namespace inferd
