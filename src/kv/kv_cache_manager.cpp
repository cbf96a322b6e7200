#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "common/check.h"

namespace inferd {

KVCacheManager::KVCacheManager(BlockPool& pool, int32_t block_size, bool prefix_caching)
    : pool_(pool), block_size_(block_size), prefix_caching_(prefix_caching) {
  INFERD_CHECK(block_size > 0);
}

BlockHash cache_salt_key(std::string_view salt) {
  if (salt.empty()) return BlockHash{};
  // A domain of its own: no token run hashes to it.
  const std::string input = std::string("inferd cache salt\0", 18) + std::string(salt);
  const XXH128_hash_t h = XXH3_128bits(input.data(), input.size());
  return BlockHash{h.low64, h.high64};
}

BlockHash KVCacheManager::hash_block(const BlockHash* parent, const Tokens& tokens, int64_t block) {
  // Input: the parent's 16-byte key (zeros for the first block), then the block's token ids.
  scratch_.resize(4 + static_cast<size_t>(block_size_));
  const BlockHash p = parent != nullptr ? *parent : tokens.root;
  std::memcpy(scratch_.data(), &p.lo, 8);
  std::memcpy(scratch_.data() + 2, &p.hi, 8);
  for (int64_t i = 0; i < block_size_; ++i)
    scratch_[4 + static_cast<size_t>(i)] = tokens.at(block * block_size_ + i);
  const XXH128_hash_t h = XXH3_128bits(scratch_.data(), scratch_.size() * sizeof(int32_t));
  return BlockHash{h.low64, h.high64};
}

int64_t KVCacheManager::take_cached_prefix(RequestId id, const Tokens& tokens,
                                           std::vector<BlockHash>* remote) {
  if (remote != nullptr) remote->clear();
  if (!prefix_caching_) return 0;
  INFERD_CHECK(tables_.find(id) == tables_.end());
  query_tokens_ += tokens.size();
  const int64_t max_blocks = (tokens.size() - 1) / block_size_;
  Table table;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const BlockHash h = hash_block(b == 0 ? nullptr : &table.hashes.back(), tokens, b);
    const int32_t block = pool_.find_cached(h);
    if (block < 0) break;
    pool_.touch(block);
    table.blocks.push_back(block);
    table.hashes.push_back(h);
  }
  if (source_ != nullptr && remote != nullptr) {
    // Past the pool's own blocks: the source may hold the rest of the chain.
    for (auto b = static_cast<int64_t>(table.blocks.size()); b < max_blocks; ++b) {
      const BlockHash* parent = b == 0 ? nullptr : remote->empty() ? &table.hashes.back() : &remote->back();
      remote->push_back(hash_block(parent, tokens, b));
    }
  }
  const int64_t hit = static_cast<int64_t>(table.blocks.size()) * block_size_;
  hit_tokens_ += hit;
  if (!table.blocks.empty()) tables_.emplace(id, std::move(table));
  return hit;
}

std::optional<std::vector<int32_t>> KVCacheManager::reserve_blocks(int64_t n) {
  if (n < 0 || n > pool_.num_free_blocks()) return std::nullopt;
  return pool_.allocate(static_cast<int32_t>(n));
}

void KVCacheManager::release_blocks(std::span<const int32_t> blocks) {
  pool_.release(blocks);
}

std::vector<BlockHash> KVCacheManager::block_keys(const Tokens& tokens, int64_t num_tokens) {
  INFERD_CHECK(num_tokens >= 0 && num_tokens <= tokens.size());
  std::vector<BlockHash> keys;
  const int64_t full = num_tokens / block_size_;
  for (int64_t b = 0; b < full; ++b) keys.push_back(hash_block(b == 0 ? nullptr : &keys.back(), tokens, b));
  const int64_t tail = num_tokens - full * block_size_;
  if (tail > 0) {
    // Input: the parent's key, a domain word and the count, then the tail's token ids.
    scratch_.assign(6 + static_cast<size_t>(tail), 0);
    const BlockHash p = full == 0 ? tokens.root : keys.back();
    std::memcpy(scratch_.data(), &p.lo, 8);
    std::memcpy(scratch_.data() + 2, &p.hi, 8);
    scratch_[4] = 0x4b565054;  // "TPVK": a partial block
    scratch_[5] = static_cast<int32_t>(tail);
    for (int64_t i = 0; i < tail; ++i)
      scratch_[6 + static_cast<size_t>(i)] = tokens.at(full * block_size_ + i);
    const XXH128_hash_t h = XXH3_128bits(scratch_.data(), scratch_.size() * sizeof(int32_t));
    keys.push_back(BlockHash{h.low64, h.high64});
  }
  return keys;
}

int64_t KVCacheManager::adopt_loaded(RequestId id, std::span<const BlockHash> keys,
                                     std::span<const int32_t> blocks, int64_t loaded,
                                     int64_t last_block_tokens, bool from_tier) {
  INFERD_CHECK(keys.size() == blocks.size() && loaded >= 0 && loaded <= static_cast<int64_t>(keys.size()));
  INFERD_CHECK(last_block_tokens < block_size_);
  Table& t = tables_[id];
  INFERD_CHECK(t.hashes.size() == t.blocks.size() && t.evicted_blocks == 0);  // just its cached prefix
  const bool partial_tail =
      last_block_tokens > 0 && loaded == static_cast<int64_t>(keys.size()) && loaded > 0;
  const int64_t full = partial_tail ? loaded - 1 : loaded;
  for (int64_t i = 0; i < full; ++i) {
    const auto k = static_cast<size_t>(i);
    int32_t block = blocks[k];
    const int32_t existing = pool_.find_cached(keys[k]);
    if (existing >= 0 && existing != block) {
      pool_.touch(existing);  // computed meanwhile by another request: share it, drop ours
      pool_.release(blocks.subspan(k, 1));
      block = existing;
    } else {
      pool_.cache_block(block, keys[k]);
      if (from_tier) pool_.mark_offloaded(block);
    }
    t.blocks.push_back(block);
    t.hashes.push_back(keys[k]);
  }
  if (partial_tail) t.blocks.push_back(blocks[static_cast<size_t>(full)]);  // uncached: it fills up later
  if (loaded < static_cast<int64_t>(blocks.size()))
    pool_.release(blocks.subspan(static_cast<size_t>(loaded)));
  const int64_t tail_tokens = partial_tail ? last_block_tokens : 0;
  hit_tokens_ += full * block_size_ + tail_tokens;
  const int64_t covered = static_cast<int64_t>(t.hashes.size()) * block_size_ + tail_tokens;
  if (t.blocks.empty()) tables_.erase(id);
  return covered;
}

void KVCacheManager::cache_full_blocks(RequestId id, const Tokens& tokens, int64_t num_computed) {
  if (!prefix_caching_) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const int64_t full =
      std::min<int64_t>(num_computed / block_size_, static_cast<int64_t>(t.blocks.size()) + t.evicted_blocks);
  for (auto b = static_cast<int64_t>(t.hashes.size()); b < full; ++b) {
    const BlockHash h = hash_block(b == 0 ? nullptr : &t.hashes.back(), tokens, b);
    t.hashes.push_back(h);
    if (const int64_t i = t.index(b); i >= 0) pool_.cache_block(t.blocks[static_cast<size_t>(i)], h);
  }
}

bool KVCacheManager::allocate_slots(RequestId id, int64_t num_tokens) {
  auto it = tables_.find(id);
  const int64_t have =
      it == tables_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size()) + it->second.evicted_blocks;
  const int64_t need = blocks_for(num_tokens) - have;
  if (need <= 0) return true;
  if (need > pool_.num_free_blocks()) return false;
  const bool taken = pool_.allocate(static_cast<int32_t>(need), &tables_[id].blocks);
  INFERD_CHECK(taken);
  return true;
}

void KVCacheManager::reserve_table(RequestId id, int64_t max_tokens) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const auto blocks = static_cast<size_t>(blocks_for(max_tokens));
  t.blocks.reserve(blocks);
  if (prefix_caching_) t.hashes.reserve(blocks);
}

bool KVCacheManager::fork(RequestId parent, RequestId child, int64_t num_tokens,
                          std::optional<BlockCopy>* copy) {
  INFERD_CHECK(tables_.find(child) == tables_.end());
  const Table& from = tables_.at(parent);
  const auto& source = from.blocks;
  const int64_t full_blocks = num_tokens / block_size_;
  const bool partial = num_tokens % block_size_ != 0;
  // Entries of the parent's table for the full position blocks (those given back have none).
  const int64_t full = std::min(full_blocks, from.sink_blocks) +
                       std::max<int64_t>(0, full_blocks - from.sink_blocks - from.evicted_blocks);
  INFERD_CHECK(full + (partial ? 1 : 0) <= static_cast<int64_t>(source.size()));
  INFERD_CHECK(!partial || from.index(full_blocks) == full);
  copy->reset();
  Table table;
  table.sink_blocks = from.sink_blocks;
  table.evicted_blocks = from.evicted_blocks;
  table.blocks.assign(source.begin(), source.begin() + full);
  if (partial) {
    auto fresh = pool_.allocate(1);
    if (!fresh) return false;
    *copy = BlockCopy{source[static_cast<size_t>(full)], (*fresh)[0]};
    table.blocks.push_back((*fresh)[0]);
  }
  for (int64_t i = 0; i < full; ++i) pool_.add_ref(table.blocks[static_cast<size_t>(i)]);
  const auto& parent_hashes = from.hashes;
  table.hashes.assign(
      parent_hashes.begin(),
      parent_hashes.begin() + std::min<int64_t>(full_blocks, static_cast<int64_t>(parent_hashes.size())));
  tables_.emplace(child, std::move(table));
  return true;
}

std::span<const int32_t> KVCacheManager::block_table(RequestId id) const {
  auto it = tables_.find(id);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

int64_t KVCacheManager::slot(RequestId id, int64_t pos) const {
  auto it = tables_.find(id);
  INFERD_CHECK(pos >= 0 && it != tables_.end());
  const int64_t index = it->second.index(pos / block_size_);
  INFERD_CHECK(index >= 0 && index < static_cast<int64_t>(it->second.blocks.size()));
  return static_cast<int64_t>(it->second.blocks[static_cast<size_t>(index)]) * block_size_ +
         pos % block_size_;
}

int64_t KVCacheManager::evict(RequestId id, int64_t sink_blocks, int64_t end_block) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return 0;
  Table& t = it->second;
  INFERD_CHECK(sink_blocks >= 0 && (t.evicted_blocks == 0 || t.sink_blocks == sink_blocks));
  const int64_t first = sink_blocks + t.evicted_blocks;  // first position block still held past the sink
  const int64_t held = static_cast<int64_t>(t.blocks.size()) + t.evicted_blocks;
  const int64_t n = std::min(end_block, held) - first;
  if (n <= 0) return 0;
  t.sink_blocks = sink_blocks;
  const auto begin = t.blocks.begin() + (first - t.evicted_blocks);
  pool_.release(std::span<const int32_t>(&*begin, static_cast<size_t>(n)));
  t.blocks.erase(begin, begin + n);
  t.evicted_blocks += n;
  return n;
}

int64_t KVCacheManager::evicted_blocks(RequestId id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? 0 : it->second.evicted_blocks;
}

void KVCacheManager::release_tail_first(std::span<const int32_t> blocks) {
  // A sequence's tail blocks are the least likely to be shared: freed first, reused first.
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.release(std::span<const int32_t>(&*b, 1));
}

void KVCacheManager::free(RequestId id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  release_tail_first(it->second.blocks);
  tables_.erase(it);
}

void KVCacheManager::pin_session(const std::string& session, RequestId id,
                                 std::chrono::steady_clock::time_point expiry, int64_t max_pinned) {
  auto table = tables_.find(id);
  Pin pin;
  pin.expiry = expiry;
  pin.order = pin_order_++;
  if (table != tables_.end()) {
    const Table& t = table->second;
    const auto keyed = static_cast<int64_t>(t.hashes.size());  // full, computed, content-keyed blocks
    for (int64_t b = 0; b < keyed; ++b) {  // up to a window's hole: the next turn's chain stops there
      const int64_t i = t.index(b);
      if (i < 0) break;
      pin.blocks.push_back(t.blocks[static_cast<size_t>(i)]);
    }
  }
  for (int32_t b : pin.blocks) pool_.add_ref(b);  // before the old pin goes: shared blocks stay
  if (auto old = sessions_.find(session); old != sessions_.end()) unpin(old);
  if (pin.blocks.empty() || static_cast<int64_t>(pin.blocks.size()) > max_pinned) {
    release_tail_first(pin.blocks);  // nothing to keep, or more than the whole share: ordinary LRU
    return;
  }
  pinned_blocks_ += static_cast<int64_t>(pin.blocks.size());
  sessions_.emplace(session, std::move(pin));
  while (pinned_blocks_ > max_pinned && drop_oldest_session()) {
  }
}

void KVCacheManager::unpin(std::unordered_map<std::string, Pin>::iterator it) {
  release_tail_first(it->second.blocks);
  pinned_blocks_ -= static_cast<int64_t>(it->second.blocks.size());
  sessions_.erase(it);
}

void KVCacheManager::expire_sessions(std::chrono::steady_clock::time_point now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (it->second.expiry <= now) unpin(it);
    it = next;
  }
}

bool KVCacheManager::drop_oldest_session() {
  if (sessions_.empty()) return false;
  auto oldest = sessions_.begin();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.order < oldest->second.order) oldest = it;
  }
  unpin(oldest);
  return true;
}

double KVCacheManager::usage() const {
  return static_cast<double>(pool_.num_used_blocks()) / static_cast<double>(pool_.num_blocks());
}

}  // namespace inferd
