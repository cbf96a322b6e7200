#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/half.h"
#include "kernels/f32_kernels.h"

namespace inferd {

std::optional<KvDType> kv_dtype_from_name(const std::string& name) {
  if (name == "f16" || name == "float16") return KvDType::kF16;
  if (name == "bf16" || name == "bfloat16") return KvDType::kBF16;
  if (name == "f32" || name == "float32") return KvDType::kF32;
  if (name == "int8") return KvDType::kInt8;
  if (name == "fp8" || name == "fp8_e4m3") return KvDType::kFp8;
  return std::nullopt;
}

std::string_view kv_dtype_name(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF16: return "f16";
    case KvDType::kBF16: return "bf16";
    case KvDType::kInt8: return "int8";
    case KvDType::kFp8: return "fp8";
    case KvDType::kF32: break;
  }
  return "f32";
}

size_t kv_dtype_bytes(KvDType dtype) {
  if (kv_dtype_is_8bit(dtype)) return 1;
  return dtype == KvDType::kF32 ? 4 : 2;
}

KvCache::KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim, KvDType dtype,
                 int64_t head_dim, bool group_keys)
    : num_layers_(num_layers),
      num_blocks_(num_blocks),
      block_size_(block_size),
      kv_dim_(kv_dim),
      heads_(kv_dtype_is_8bit(dtype) && head_dim > 0 ? kv_dim / head_dim : 0),
      dtype_(dtype),
      key_groups_(group_keys && block_size % kKeyGroup == 0) {
  INFERD_CHECK(num_layers > 0 && num_blocks > 0 && block_size > 0 && kv_dim > 0);
  const auto n = static_cast<size_t>(num_layers * num_blocks * block_size * kv_dim) * kv_dtype_bytes(dtype);
  keys_ = PageBuffer(n);
  values_ = PageBuffer(n);
  if (kv_dtype_is_8bit(dtype)) {
    INFERD_CHECK(head_dim > 0 && kv_dim % head_dim == 0);
    key_scales_.assign(scale_index(num_layers, 0), 0.0f);
    value_scales_.assign(key_scales_.size(), 0.0f);
  }
}

namespace {

// One head of one token in 8 bits: codes (`stride` bytes apart) and the scale that maps them back.
void store_8bit(std::byte* dst, size_t stride, float* scale, const float* src, int64_t n, KvDType dtype) {
  // A non-finite input (garbage in) is stored as 0 and left out of the scale, so it cannot wipe
  // out the rest of its head.
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(src[i])) amax = std::max(amax, std::fabs(src[i]));
  const float top = dtype == KvDType::kInt8 ? 127.0f : 448.0f;
  float inv = amax > 0.0f ? top / amax : 0.0f;
  if (!std::isfinite(inv)) inv = 0.0f;  // a head of denormals: stored as zeros
  *scale = inv > 0.0f ? amax / top : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::isfinite(src[i]) ? src[i] * inv : 0.0f;
    std::byte& code = dst[static_cast<size_t>(i) * stride];
    if (dtype == KvDType::kInt8) {
      const float r = std::clamp(std::nearbyint(v), -127.0f, 127.0f);  // round half to even
      code = static_cast<std::byte>(static_cast<int8_t>(r));
    } else {
      code = static_cast<std::byte>(f32_to_fp8_e4m3(v));
    }
  }
}

float load_8bit(std::byte code, float scale, KvDType dtype) {
  const auto b = static_cast<uint8_t>(code);
  if (dtype == KvDType::kInt8) return static_cast<float>(static_cast<int8_t>(b)) * scale;
  // As attention computes it: the code as an f16 (value * 2^-8) times scale * 256, the same bits.
  return f16_to_f32(fp8_e4m3_as_f16_bits(b)) * (scale * 256.0f);
}

// n elements, `stride` bytes apart.
void store(std::byte* dst, size_t stride, const float* src, int64_t n, KvDType dtype) {
  switch (dtype) {
    case KvDType::kInt8:
    case KvDType::kFp8: break;  // store_8bit
    case KvDType::kF32:
      if (stride == sizeof(float)) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
      }
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + static_cast<size_t>(i) * stride, &src[i], 4);
      return;
    case KvDType::kF16: return f32_kernels().f32_to_f16(src, n, dst, stride);
    case KvDType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + static_cast<size_t>(i) * stride, &h, 2);
      }
      return;
  }
}

float load(const std::byte* p, KvDType dtype, float scale) {
  switch (dtype) {
    case KvDType::kF32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case KvDType::kF16: return load_f16(p);
    case KvDType::kBF16: return bf16_to_f32(load_u16(p));
    case KvDType::kInt8:
    case KvDType::kFp8: return load_8bit(*p, scale, dtype);
  }
  return 0.0f;
}

// One block of one layer's keys between rows ([slot][kv_dim], to_groups) and groups of 16 slots
// ([slot / 16][kv_dim][16], !to_groups), elements of E bytes.
template <size_t E>
void regroup(const std::byte* src, std::byte* dst, int64_t slots, int64_t kv_dim, bool to_groups) {
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t i = 0; i < kv_dim; ++i) {
      const auto row = static_cast<size_t>(s * kv_dim + i) * E;
      const auto group = static_cast<size_t>(key_group_index(s, i, kv_dim)) * E;
      std::memcpy(dst + (to_groups ? group : row), src + (to_groups ? row : group), E);
    }
  }
}

void regroup_keys(const std::byte* src, std::byte* dst, int64_t slots, int64_t kv_dim, size_t elem,
                  bool to_groups) {
  if (elem == 1) return regroup<1>(src, dst, slots, kv_dim, to_groups);
  if (elem == 2) return regroup<2>(src, dst, slots, kv_dim, to_groups);
  regroup<4>(src, dst, slots, kv_dim, to_groups);
}
}  // namespace

void KvCache::write(int64_t layer, int64_t slot, const float* key, const float* value) {
  const size_t elem = kv_dtype_bytes(dtype_), key_stride = key_stride_bytes();
  if (kv_dtype_is_8bit(dtype_)) {
    const int64_t hd = kv_dim_ / heads_;
    const size_t at = offset_bytes(layer, slot), si = scale_index(layer, slot);
    for (int64_t h = 0; h < heads_; ++h) {
      store_8bit(keys_.data() + key_offset_bytes(layer, slot, h * hd), key_stride,
                 &key_scales_[si + static_cast<size_t>(h)], key + h * hd, hd, dtype_);
      store_8bit(values_.data() + at + static_cast<size_t>(h * hd), elem,
                 &value_scales_[si + static_cast<size_t>(h)], value + h * hd, hd, dtype_);
    }
    return;
  }
  store(keys_.data() + key_offset_bytes(layer, slot, 0), key_stride, key, kv_dim_, dtype_);
  store(values_.data() + offset_bytes(layer, slot), elem, value, kv_dim_, dtype_);
}

void KvCache::read(int64_t layer, int64_t slot, float* key, float* value) const {
  const size_t at = offset_bytes(layer, slot), elem = kv_dtype_bytes(dtype_);
  for (int64_t i = 0; i < kv_dim_; ++i) {
    float key_scale = 1.0f, value_scale = 1.0f;
    if (kv_dtype_is_8bit(dtype_)) {
      const size_t si = scale_index(layer, slot) + static_cast<size_t>(i / (kv_dim_ / heads_));
      key_scale = key_scales_[si];
      value_scale = value_scales_[si];
    }
    key[i] = load(keys_.data() + key_offset_bytes(layer, slot, i), dtype_, key_scale);
    value[i] = load(values_.data() + at + static_cast<size_t>(i) * elem, dtype_, value_scale);
  }
}

void KvCache::copy_block(int64_t src, int64_t dst) {
  INFERD_CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_);
  const size_t bytes = offset_bytes(0, block_size_);  // one block of one layer
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    std::memcpy(keys_.data() + offset_bytes(layer, dst * block_size_),
                keys_.data() + offset_bytes(layer, src * block_size_), bytes);
    std::memcpy(values_.data() + offset_bytes(layer, dst * block_size_),
                values_.data() + offset_bytes(layer, src * block_size_), bytes);
    if (!key_scales_.empty()) {
      const auto n = static_cast<size_t>(block_size_ * heads_);
      std::copy_n(&key_scales_[scale_index(layer, src * block_size_)], n,
                  &key_scales_[scale_index(layer, dst * block_size_)]);
      std::copy_n(&value_scales_[scale_index(layer, src * block_size_)], n,
                  &value_scales_[scale_index(layer, dst * block_size_)]);
    }
  }
}

void KvCache::export_block(int64_t block, std::byte* out) const {
  INFERD_CHECK(block >= 0 && block < num_blocks_);
  const size_t bytes = offset_bytes(0, block_size_);
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    const size_t at = offset_bytes(layer, block * block_size_);
    if (key_groups_) {
      regroup_keys(keys_.data() + at, out, block_size_, kv_dim_, kv_dtype_bytes(dtype_), false);
    } else {
      std::memcpy(out, keys_.data() + at, bytes);
    }
    std::memcpy(out + bytes, values_.data() + at, bytes);
    out += 2 * bytes;
    if (const size_t sb = scale_bytes_per_block(); sb > 0) {
      const size_t si = scale_index(layer, block * block_size_);
      std::memcpy(out, &key_scales_[si], sb);
      std::memcpy(out + sb, &value_scales_[si], sb);
      out += 2 * sb;
    }
  }
}

void KvCache::import_block(int64_t block, const std::byte* in) {
  INFERD_CHECK(block >= 0 && block < num_blocks_);
  const size_t bytes = offset_bytes(0, block_size_);
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    const size_t at = offset_bytes(layer, block * block_size_);
    if (key_groups_) {
      regroup_keys(in, keys_.data() + at, block_size_, kv_dim_, kv_dtype_bytes(dtype_), true);
    } else {
      std::memcpy(keys_.data() + at, in, bytes);
    }
    std::memcpy(values_.data() + at, in + bytes, bytes);
    in += 2 * bytes;
    if (const size_t sb = scale_bytes_per_block(); sb > 0) {
      const size_t si = scale_index(layer, block * block_size_);
      std::memcpy(&key_scales_[si], in, sb);
      std::memcpy(&value_scales_[si], in + sb, sb);
      in += 2 * sb;
    }
  }
}

KvLayerView KvCache::layer_view(int64_t layer) const {
  KvLayerView view{keys_.data() + offset_bytes(layer, 0), values_.data() + offset_bytes(layer, 0),
                   block_size_, dtype_};
  view.key_groups = key_groups_;
  if (!key_scales_.empty()) {
    view.key_scale = &key_scales_[scale_index(layer, 0)];
    view.value_scale = &value_scales_[scale_index(layer, 0)];
  }
  return view;
}

}  // namespace inferd
