// KvCache: the memory that holds every layer's keys and values, as slots grouped in blocks.
// The transformer writes new tokens' K/V to slots and attention reads them through block
// tables; which request owns which block is decided above it (engine/, kv/ block manager).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace inferd {

class KvCache final {
 public:
  // Allocates num_blocks * block_size slots of kv_dim floats for K and for V, per layer.
  KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  int64_t kv_dim() const { return kv_dim_; }

  float* key(int64_t layer, int64_t slot) { return keys_.data() + offset(layer, slot); }
  float* value(int64_t layer, int64_t slot) { return values_.data() + offset(layer, slot); }
  KvLayerView layer_view(int64_t layer) const;

 private:
  size_t offset(int64_t layer, int64_t slot) const {
    return static_cast<size_t>((layer * num_slots() + slot) * kv_dim_);
  }

  int64_t num_layers_, num_blocks_, block_size_, kv_dim_;
  std::vector<float> keys_;    // [layers, slots, kv_dim]
  std::vector<float> values_;  // [layers, slots, kv_dim]
};

}  // namespace inferd
