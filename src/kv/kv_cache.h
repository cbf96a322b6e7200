// KvCache: the memory that holds every layer's keys and values, as slots grouped in blocks,
// stored as f16 (default), bf16 or f32. The transformer writes new tokens' K/V to slots and
// attention reads them through block tables; which request owns which block is decided above
// it (BlockPool / KVCacheManager). Allocated once; engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention.h"

namespace inferd {

// "f16", "bf16", "f32" -> KvDType.
std::optional<KvDType> kv_dtype_from_name(const std::string& name);
std::string_view kv_dtype_name(KvDType dtype);
size_t kv_dtype_bytes(KvDType dtype);

class KvCache final {
 public:
  // Allocates num_blocks * block_size slots of kv_dim elements for K and for V, per layer.
  KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim,
          KvDType dtype = KvDType::kF32);

  // Bytes one token's K and V take over all layers.
  static int64_t bytes_per_token(int64_t num_layers, int64_t kv_dim, KvDType dtype) {
    return 2 * num_layers * kv_dim * static_cast<int64_t>(kv_dtype_bytes(dtype));
  }

  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  KvDType dtype() const { return dtype_; }

  // Stores one token's K and V ([kv_dim] f32 each) in `slot` of `layer`, rounding to dtype.
  void write(int64_t layer, int64_t slot, const float* key, const float* value);
  KvLayerView layer_view(int64_t layer) const;
  // Copies every layer's K and V of block `src` into block `dst` (copy-on-write of a shared block).
  void copy_block(int64_t src, int64_t dst);
  // Bytes of one block over all layers, K and V: what export_block writes.
  size_t block_bytes() const { return 2 * static_cast<size_t>(num_layers_) * offset_bytes(0, block_size_); }
  // Writes block `block` as [layer][K rows, V rows] into out[0, block_bytes()) (offload tiers)...
  void export_block(int64_t block, std::byte* out) const;
  // ...and reads it back from that layout.
  void import_block(int64_t block, const std::byte* in);

 private:
  size_t offset_bytes(int64_t layer, int64_t slot) const {
    return static_cast<size_t>((layer * num_slots() + slot) * kv_dim_) * kv_dtype_bytes(dtype_);
  }

  int64_t num_layers_, num_blocks_, block_size_, kv_dim_;
  KvDType dtype_;
  std::vector<std::byte> keys_;    // [layers, slots, kv_dim]
  std::vector<std::byte> values_;  // [layers, slots, kv_dim]
};

}  // namespace inferd
