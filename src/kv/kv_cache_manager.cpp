#include "kv/kv_cache_manager.h"

#include <vector>

#include "common/check.h"

namespace inferd {

KVCacheManager::KVCacheManager(BlockPool& pool, int32_t block_size) : pool_(pool), block_size_(block_size) {
  INFERD_CHECK(block_size > 0);
}

bool KVCacheManager::allocate_slots(RequestId id, int64_t num_tokens) {
  auto it = tables_.find(id);
  const int64_t have = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
  const int64_t need = blocks_for(num_tokens) - have;
  if (need <= 0) return true;
  if (need > pool_.num_free_blocks()) return false;
  auto blocks = pool_.allocate(static_cast<int32_t>(need));
  INFERD_CHECK(blocks.has_value());
  auto& table = tables_[id];
  table.insert(table.end(), blocks->begin(), blocks->end());
  return true;
}

bool KVCacheManager::fork(RequestId parent, RequestId child, int64_t num_tokens,
                          std::optional<BlockCopy>* copy) {
  INFERD_CHECK(tables_.find(child) == tables_.end());
  const auto source = block_table(parent);
  const int64_t full = num_tokens / block_size_;
  const bool partial = num_tokens % block_size_ != 0;
  INFERD_CHECK(full + (partial ? 1 : 0) <= static_cast<int64_t>(source.size()));
  copy->reset();
  std::vector<int32_t> table(source.begin(), source.begin() + full);
  if (partial) {
    auto fresh = pool_.allocate(1);
    if (!fresh) return false;
    *copy = BlockCopy{source[static_cast<size_t>(full)], (*fresh)[0]};
    table.push_back((*fresh)[0]);
  }
  for (int64_t i = 0; i < full; ++i) pool_.add_ref(table[static_cast<size_t>(i)]);
  tables_.emplace(child, std::move(table));
  return true;
}

std::span<const int32_t> KVCacheManager::block_table(RequestId id) const {
  auto it = tables_.find(id);
  if (it == tables_.end()) return {};
  return it->second;
}

int64_t KVCacheManager::slot(RequestId id, int64_t pos) const {
  const auto table = block_table(id);
  const auto index = static_cast<size_t>(pos / block_size_);
  INFERD_CHECK(pos >= 0 && index < table.size());
  return static_cast<int64_t>(table[index]) * block_size_ + pos % block_size_;
}

void KVCacheManager::free(RequestId id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  std::vector<int32_t> reversed(it->second.rbegin(), it->second.rend());
  pool_.release(reversed);
  tables_.erase(it);
}

double KVCacheManager::usage() const {
  return static_cast<double>(pool_.num_used_blocks()) / static_cast<double>(pool_.num_blocks());
}

}  // namespace inferd
