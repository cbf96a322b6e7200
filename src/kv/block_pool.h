// BlockPool: the fixed set of KV-cache blocks, with reference counts and a free queue in
// least-recently-freed order. KVCacheManager (per-request block tables) sits on top of it;
// prefix caching revives freed blocks by their content key, and the offload tiers (KvOffloader)
// keep cached blocks' contents beyond the pool. Engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace inferd {

// Content key of a full KV block: a 128-bit hash chain over (parent key, the block's token ids).
// 128 bits make an accidental collision negligible (about 2^-64 at 2^32 cached blocks).
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash&) const = default;
};
// The key a cache salt (vLLM's cache_salt) mixes into a request's hash-chain root: requests
// share cached blocks only with requests of the same salt. Empty: zero (no salt).
BlockHash cache_salt_key(std::string_view salt);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo); }
};

class BlockPool final {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free_blocks() const { return num_free_; }
  int32_t num_used_blocks() const { return num_blocks() - num_free_; }
  int32_t ref_count(int32_t block) const { return blocks_[static_cast<size_t>(block)].ref_count; }

  // Takes `n` free blocks (least recently freed first), each with ref_count 1; nullopt (and
  // nothing taken) when fewer than n are free.
  std::optional<std::vector<int32_t>> allocate(int32_t n);
  // The same, appending the blocks to `out` (no allocation when it has the room); false (and
  // nothing taken) when fewer than n are free.
  [[nodiscard]] bool allocate(int32_t n, std::vector<int32_t>* out);

  // Adds a reference to a block in use (sharing, e.g. n > 1 samples of one prompt).
  void add_ref(int32_t block);

  // Prefix caching. Registers `block` (in use, full, computed) as holding `hash`; no-op when that
  // content is already cached in another block or this block already has a key.
  void cache_block(int32_t block, const BlockHash& hash);
  // The block holding `hash`, in use or free-but-not-yet-reused, or -1.
  int32_t find_cached(const BlockHash& hash) const;
  // Takes a reference to a cached block; a free one leaves the free queue (it is revived).
  void touch(int32_t block);
  int32_t num_cached_blocks() const { return num_cached_; }
  int64_t num_revived() const { return num_revived_; }

  // Drops one reference of each block; a block whose count reaches 0 goes to the free queue: a
  // cached one to the tail (keeping its content key: it can be revived until allocate() reuses
  // it), one without a key to the head (it holds nothing worth keeping: reused first). Blocks are
  // released in the given order (callers pass a request's table in reverse, so its tail blocks are
  // reused first).
  void release(std::span<const int32_t> blocks);

  // Offload tiers. A cached block whose contents a tier holds (written or loaded from there) is
  // "offloaded" until it is reused for other contents.
  void mark_offloaded(int32_t block);
  bool offloaded(int32_t block) const { return blocks_[static_cast<size_t>(block)].offloaded; }
  BlockHash hash_of(int32_t block) const { return blocks_[static_cast<size_t>(block)].hash; }
  // Called when allocate() is about to reuse a cached block that no tier holds yet (its contents
  // are still intact): the last chance to write them out.
  void set_evict_hook(std::function<void(int32_t block, const BlockHash& hash)> hook) {
    evict_hook_ = std::move(hook);
  }
  // Free, cached blocks no tier holds yet, coldest (least recently freed) first; at most `max`.
  void coldest_unoffloaded(int32_t max, std::vector<int32_t>* out) const;
  int32_t num_free_unoffloaded() const { return num_free_unoffloaded_; }
  // Blocks in use or holding cached contents, 0..1: how full the pool is of something worth keeping.
  double content_usage() const {
    return static_cast<double>(num_used_blocks() + num_free_cached_) / static_cast<double>(num_blocks());
  }

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1, next = -1;  // free-queue links while free
    bool cached = false;           // `hash` is valid and in cached_
    bool offloaded = false;        // a tier holds the contents of `hash`
    BlockHash hash;
  };
  void push_free(int32_t b);
  void push_free_front(int32_t b);
  void count_free(const Block& blk, int32_t delta);
  int32_t pop_free();
  void unlink_free(int32_t b);
  // The index of cached blocks by key: open addressing with linear probing over a table fixed at
  // construction (at least twice the blocks, a power of two), so that caching a block in the
  // step loop never allocates. A slot holds a block (its key is blocks_[b].hash) or -1.
  size_t home_slot(const BlockHash& hash) const { return static_cast<size_t>(hash.lo) & slot_mask_; }
  int64_t find_slot(const BlockHash& hash) const;
  void index_insert(int32_t block);
  void index_erase(const BlockHash& hash);

  std::vector<Block> blocks_;
  int32_t free_head_ = -1, free_tail_ = -1;
  int32_t num_free_ = 0;
  std::vector<int32_t> slots_;
  size_t slot_mask_ = 0;
  int32_t num_cached_ = 0;
  int64_t num_revived_ = 0;
  int32_t num_free_cached_ = 0, num_free_unoffloaded_ = 0;  // free blocks that are cached / not offloaded too
  std::function<void(int32_t, const BlockHash&)> evict_hook_;
};

}  // namespace inferd
