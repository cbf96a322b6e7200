// KvCache: the memory that holds every layer's keys and values, as slots grouped in blocks,
// stored as f16 (default), bf16, f32, or 8 bits (int8 / FP8 E4M3 with a scale per token and KV
// head, which halves the bytes). The transformer writes new tokens' K/V to slots and
// attention reads them through block tables; which request owns which block is decided above
// it (BlockPool / KVCacheManager). Allocated once; engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/page_buffer.h"
#include "kernels/attention.h"

namespace inferd {

// "f16", "bf16", "f32", "int8", "fp8" (also "fp8_e4m3") -> KvDType.
std::optional<KvDType> kv_dtype_from_name(const std::string& name);
std::string_view kv_dtype_name(KvDType dtype);
// Bytes of one stored element (1 for the 8-bit dtypes, whose scales come on top).
size_t kv_dtype_bytes(KvDType dtype);

class KvCache final {
 public:
  // Allocates num_blocks * block_size slots of kv_dim elements for K and for V, per layer. The
  // 8-bit dtypes need head_dim (kv_dim / head_dim scales per slot); the others ignore it. K is
  // stored in groups of 16 slots (KvLayerView::key_groups: what the CPU attention reads fastest)
  // when group_keys and block_size is a multiple of 16, else in rows like V (a backend that reads
  // the cache's bytes itself, CUDA, asks for rows).
  KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim,
          KvDType dtype = KvDType::kF32, int64_t head_dim = 0, bool group_keys = true);

  // Bytes one token's K and V take over all layers, scales included.
  static int64_t bytes_per_token(int64_t num_layers, int64_t kv_dim, int64_t head_dim, KvDType dtype) {
    const int64_t scales = kv_dtype_is_8bit(dtype) ? kv_dim / head_dim * 4 : 0;
    return 2 * num_layers * (kv_dim * static_cast<int64_t>(kv_dtype_bytes(dtype)) + scales);
  }

  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  KvDType dtype() const { return dtype_; }
  int64_t num_heads() const { return heads_; }  // KV heads: scales per slot of an 8-bit cache
  bool key_groups() const { return key_groups_; }

  // Stores one token's K and V ([kv_dim] f32 each) in `slot` of `layer`, rounding to dtype (the
  // 8-bit dtypes: per head, scale = largest magnitude / 127 (int8) or / 448 (FP8), each element
  // rounded to nearest even).
  void write(int64_t layer, int64_t slot, const float* key, const float* value);
  // What `slot` of `layer` holds, as f32: the values attention computes with.
  void read(int64_t layer, int64_t slot, float* key, float* value) const;
  KvLayerView layer_view(int64_t layer) const;
  // Copies every layer's K and V of block `src` into block `dst` (copy-on-write of a shared block).
  void copy_block(int64_t src, int64_t dst);
  // Bytes of one block over all layers, K and V: what export_block writes.
  size_t block_bytes() const {
    return 2 * static_cast<size_t>(num_layers_) * (offset_bytes(0, block_size_) + scale_bytes_per_block());
  }
  // Writes block `block` as [layer][K rows, V rows, K scales, V scales] (no scales unless 8-bit)
  // into out[0, block_bytes()) (offload tiers, KV transfer), K in rows whatever its layout here...
  void export_block(int64_t block, std::byte* out) const;
  // ...and reads it back from that layout.
  void import_block(int64_t block, const std::byte* in);

 private:
  size_t offset_bytes(int64_t layer, int64_t slot) const {
    return static_cast<size_t>((layer * num_slots() + slot) * kv_dim_) * kv_dtype_bytes(dtype_);
  }
  // Where element i of slot's key sits, and how far apart consecutive elements of it are.
  size_t key_offset_bytes(int64_t layer, int64_t slot, int64_t i) const {
    if (!key_groups_) return offset_bytes(layer, slot) + static_cast<size_t>(i) * kv_dtype_bytes(dtype_);
    return offset_bytes(layer, 0) +
           static_cast<size_t>(key_group_index(slot, i, kv_dim_)) * kv_dtype_bytes(dtype_);
  }
  size_t key_stride_bytes() const { return (key_groups_ ? kKeyGroup : 1) * kv_dtype_bytes(dtype_); }
  size_t scale_index(int64_t layer, int64_t slot) const {
    return static_cast<size_t>((layer * num_slots() + slot) * heads_);
  }
  size_t scale_bytes_per_block() const {
    return key_scales_.empty() ? 0 : static_cast<size_t>(block_size_ * heads_) * sizeof(float);
  }

  int64_t num_layers_, num_blocks_, block_size_, kv_dim_, heads_;
  KvDType dtype_;
  bool key_groups_;
  PageBuffer keys_;                // [layers, slots, kv_dim], or [layers, slots / 16, kv_dim, 16]
  PageBuffer values_;              // [layers, slots, kv_dim]
  std::vector<float> key_scales_;  // [layers, slots, heads]: 8-bit dtypes only
  std::vector<float> value_scales_;
};

}  // namespace inferd
