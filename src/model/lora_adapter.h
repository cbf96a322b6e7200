// LoRA adapters: low-rank updates W' = W + scale * B A of a base model's linear layers, loaded
// from PEFT's files (adapter_config.json + adapter_model.safetensors) or llama.cpp's GGUF
// adapters (general.type = adapter), checked against the base they are applied to, and kept in
// the layout the kernels want (A as stored, B transposed: kernels/lora.h), in F16 / BF16 when
// the file stores them so, else in f32.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/model_weights.h"

namespace inferd {

// The linear layers an adapter may change (every layer matrix the loaders know).
enum class LoraTarget : int { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
// PEFT's module names: "q_proj", ..., "down_proj".
std::string_view lora_target_name(LoraTarget target);

// An adapter stored in F16 or BF16 stays so in memory (half the bytes each step reads; the
// kernels expand it exactly); any other type is kept in f32.
struct LoraMatrix {
  int64_t rank = 0;  // 0: the adapter leaves this layer's matrix as it is
  float scale = 0.0f;
  DType dtype = DType::kF32;
  std::vector<float> a, bt;         // kF32: [rank, in_features] and B transposed, [rank, out_features]
  std::vector<uint16_t> a16, bt16;  // kF16 / kBF16: the same

  const void* a_data() const {
    return dtype == DType::kF32 ? static_cast<const void*>(a.data()) : a16.data();
  }
  const void* bt_data() const {
    return dtype == DType::kF32 ? static_cast<const void*>(bt.data()) : bt16.data();
  }
  // The values as f32 (a copy).
  std::vector<float> a_values() const;
  std::vector<float> bt_values() const;
};

struct LoraAdapter {
  std::string path;
  std::string format;  // "peft" or "gguf"
  int64_t max_rank = 0;
  // A hash of the update itself (every A, B and scale): the key that keeps two adapters' KV
  // apart in the prefix cache and the offload tiers, the same across restarts.
  uint64_t fingerprint_lo = 0, fingerprint_hi = 0;
  size_t bytes = 0;                                             // of the f32 matrices
  std::vector<std::array<LoraMatrix, kNumLoraTargets>> layers;  // [num_layers]
  std::array<bool, kNumLoraTargets> targets{};                  // which any layer changes

  const LoraMatrix& matrix(int64_t layer, LoraTarget t) const {
    return layers[static_cast<size_t>(layer)][static_cast<size_t>(t)];
  }
};

// Loads the adapter at `path` (a PEFT directory or a .gguf file) for `base`. Refused, with a
// message naming the tensor or field: another architecture, shapes that do not fit the base,
// a module that is not one of the seven targets (embeddings, lm_head, experts), a rank above
// `max_rank`, DoRA, trained biases, modules_to_save.
Expected<std::shared_ptr<const LoraAdapter>> load_lora_adapter(const std::string& path,
                                                               const ModelWeights& base, int64_t max_rank);

// The (out, in) shape of a target's weight in `config`'s layers.
std::array<int64_t, 2> lora_target_shape(const ModelConfig& config, LoraTarget target);

}  // namespace inferd
