#include "kv/kv_cache.h"

#include <cstring>

#include "common/check.h"
#include "common/half.h"

namespace inferd {

std::optional<KvDType> kv_dtype_from_name(const std::string& name) {
  if (name == "f16" || name == "float16") return KvDType::kF16;
  if (name == "bf16" || name == "bfloat16") return KvDType::kBF16;
  if (name == "f32" || name == "float32") return KvDType::kF32;
  return std::nullopt;
}

std::string_view kv_dtype_name(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF16: return "f16";
    case KvDType::kBF16: return "bf16";
    case KvDType::kF32: break;
  }
  return "f32";
}

size_t kv_dtype_bytes(KvDType dtype) {
  return dtype == KvDType::kF32 ? 4 : 2;
}

KvCache::KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim, KvDType dtype)
    : num_layers_(num_layers),
      num_blocks_(num_blocks),
      block_size_(block_size),
      kv_dim_(kv_dim),
      dtype_(dtype) {
  INFERD_CHECK(num_layers > 0 && num_blocks > 0 && block_size > 0 && kv_dim > 0);
  const auto n = static_cast<size_t>(num_layers * num_blocks * block_size * kv_dim) * kv_dtype_bytes(dtype);
  keys_.assign(n, std::byte{0});
  values_.assign(n, std::byte{0});
}

namespace {
void store(std::byte* dst, const float* src, int64_t n, KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case KvDType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case KvDType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
  }
}
}  // namespace

void KvCache::write(int64_t layer, int64_t slot, const float* key, const float* value) {
  store(keys_.data() + offset_bytes(layer, slot), key, kv_dim_, dtype_);
  store(values_.data() + offset_bytes(layer, slot), value, kv_dim_, dtype_);
}

void KvCache::copy_block(int64_t src, int64_t dst) {
  INFERD_CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_);
  const size_t bytes = offset_bytes(0, block_size_);  // one block of one layer
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    std::memcpy(keys_.data() + offset_bytes(layer, dst * block_size_),
                keys_.data() + offset_bytes(layer, src * block_size_), bytes);
    std::memcpy(values_.data() + offset_bytes(layer, dst * block_size_),
                values_.data() + offset_bytes(layer, src * block_size_), bytes);
  }
}

void KvCache::export_block(int64_t block, std::byte* out) const {
  INFERD_CHECK(block >= 0 && block < num_blocks_);
  const size_t bytes = offset_bytes(0, block_size_);
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    const size_t at = offset_bytes(layer, block * block_size_);
    std::memcpy(out, keys_.data() + at, bytes);
    std::memcpy(out + bytes, values_.data() + at, bytes);
    out += 2 * bytes;
  }
}

void KvCache::import_block(int64_t block, const std::byte* in) {
  INFERD_CHECK(block >= 0 && block < num_blocks_);
  const size_t bytes = offset_bytes(0, block_size_);
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    const size_t at = offset_bytes(layer, block * block_size_);
    std::memcpy(keys_.data() + at, in, bytes);
    std::memcpy(values_.data() + at, in + bytes, bytes);
    in += 2 * bytes;
  }
}

KvLayerView KvCache::layer_view(int64_t layer) const {
  return KvLayerView{keys_.data() + offset_bytes(layer, 0), values_.data() + offset_bytes(layer, 0),
                     block_size_, dtype_};
}

}  // namespace inferd
