#include "kv/block_pool.h"

#include "common/check.h"

namespace inferd {

BlockPool::BlockPool(int32_t num_blocks) : blocks_(static_cast<size_t>(num_blocks)) {
  INFERD_CHECK(num_blocks > 0);
  for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
}

void BlockPool::push_free(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  blk.prev = free_tail_;
  blk.next = -1;
  if (free_tail_ >= 0) {
    blocks_[static_cast<size_t>(free_tail_)].next = b;
  } else {
    free_head_ = b;
  }
  free_tail_ = b;
  ++num_free_;
}

void BlockPool::unlink_free(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.prev >= 0) {
    blocks_[static_cast<size_t>(blk.prev)].next = blk.next;
  } else {
    free_head_ = blk.next;
  }
  if (blk.next >= 0) {
    blocks_[static_cast<size_t>(blk.next)].prev = blk.prev;
  } else {
    free_tail_ = blk.prev;
  }
  blk.prev = blk.next = -1;
  --num_free_;
}

int32_t BlockPool::pop_free() {
  const int32_t b = free_head_;
  INFERD_CHECK(b >= 0);
  unlink_free(b);
  Block& blk = blocks_[static_cast<size_t>(b)];
  if (blk.cached) {  // reused for new content: its old key goes
    cached_.erase(blk.hash);
    blk.cached = false;
  }
  return b;
}

void BlockPool::cache_block(int32_t block, const BlockHash& hash) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  INFERD_CHECK(blk.ref_count > 0);
  if (blk.cached || cached_.count(hash) != 0) return;
  blk.cached = true;
  blk.hash = hash;
  cached_.emplace(hash, block);
}

int32_t BlockPool::find_cached(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  return it == cached_.end() ? -1 : it->second;
}

void BlockPool::touch(int32_t block) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  INFERD_CHECK(blk.cached);
  if (blk.ref_count == 0) {
    unlink_free(block);
    ++num_revived_;
  }
  ++blk.ref_count;
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int32_t n) {
  if (n < 0 || n > num_free_) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = pop_free();
    INFERD_CHECK(blocks_[static_cast<size_t>(b)].ref_count == 0);
    blocks_[static_cast<size_t>(b)].ref_count = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::add_ref(int32_t block) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  INFERD_CHECK(blk.ref_count > 0);
  ++blk.ref_count;
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    Block& blk = blocks_[static_cast<size_t>(b)];
    INFERD_CHECK_MSG(blk.ref_count > 0, "releasing a free block");
    if (--blk.ref_count == 0) push_free(b);
  }
}

}  // namespace inferd
