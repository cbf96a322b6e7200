#include "kv/kv_cache.h"

#include "common/check.h"

namespace inferd {

KvCache::KvCache(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim)
    : num_layers_(num_layers), num_blocks_(num_blocks), block_size_(block_size), kv_dim_(kv_dim) {
  INFERD_CHECK(num_layers > 0 && num_blocks > 0 && block_size > 0 && kv_dim > 0);
  const auto n = static_cast<size_t>(num_layers * num_blocks * block_size * kv_dim);
  keys_.assign(n, 0.0f);
  values_.assign(n, 0.0f);
}

KvLayerView KvCache::layer_view(int64_t layer) const {
  return KvLayerView{keys_.data() + offset(layer, 0), values_.data() + offset(layer, 0), block_size_};
}

}  // namespace inferd
