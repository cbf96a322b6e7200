// BlockPool: the fixed set of KV-cache blocks, with reference counts and a free queue in
// least-recently-freed order. KVCacheManager (per-request block tables) sits on top of it;
// prefix caching will revive freed blocks by their content key. Engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace inferd {

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

  // Adds a reference to a block in use (sharing, e.g. n > 1 samples of one prompt).
  void add_ref(int32_t block);

  // Drops one reference of each block; a block whose count reaches 0 goes to the tail of the
  // free queue. Blocks are released in the given order (callers pass a request's table in
  // reverse, so its tail blocks are reused first).
  void release(std::span<const int32_t> blocks);

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1, next = -1;  // free-queue links while free
  };
  void push_free(int32_t b);
  int32_t pop_free();

  std::vector<Block> blocks_;
  int32_t free_head_ = -1, free_tail_ = -1;
  int32_t num_free_ = 0;
};

}  // namespace inferd
