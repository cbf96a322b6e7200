#include "kv/block_pool.h"

#include "common/check.h"

namespace inferd {

BlockPool::BlockPool(int32_t num_blocks) : blocks_(static_cast<size_t>(num_blocks)) {
  INFERD_CHECK(num_blocks > 0);
  for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
}

void BlockPool::count_free(const Block& blk, int32_t delta) {
  num_free_ += delta;
  if (blk.cached) {
    num_free_cached_ += delta;
    if (!blk.offloaded) num_free_unoffloaded_ += delta;
  }
}

void BlockPool::push_free_front(int32_t b) {
  Block& blk = blocks_[static_cast<size_t>(b)];
  blk.prev = -1;
  blk.next = free_head_;
  if (free_head_ >= 0) {
    blocks_[static_cast<size_t>(free_head_)].prev = b;
  } else {
    free_tail_ = b;
  }
  free_head_ = b;
  count_free(blk, 1);
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
  count_free(blk, 1);
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
  count_free(blk, -1);
}

int32_t BlockPool::pop_free() {
  const int32_t b = free_head_;
  INFERD_CHECK(b >= 0);
  Block& blk = blocks_[static_cast<size_t>(b)];
  // Still free and intact: the offload tiers' last chance to keep its contents.
  if (blk.cached && !blk.offloaded && evict_hook_) evict_hook_(b, blk.hash);
  unlink_free(b);
  if (blk.cached) {  // reused for new content: its old key goes
    cached_.erase(blk.hash);
    blk.cached = false;
    blk.offloaded = false;
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
    if (--blk.ref_count == 0) {
      if (blk.cached) {
        push_free(b);
      } else {
        push_free_front(b);
      }
    }
  }
}

void BlockPool::mark_offloaded(int32_t block) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  INFERD_CHECK(blk.cached);
  if (blk.offloaded) return;
  const bool free = blk.ref_count == 0;
  if (free) count_free(blk, -1);
  blk.offloaded = true;
  if (free) count_free(blk, 1);
}

void BlockPool::coldest_unoffloaded(int32_t max, std::vector<int32_t>* out) const {
  out->clear();
  if (num_free_unoffloaded_ == 0) return;
  for (int32_t b = free_head_; b >= 0 && static_cast<int32_t>(out->size()) < max;
       b = blocks_[static_cast<size_t>(b)].next) {
    const Block& blk = blocks_[static_cast<size_t>(b)];
    if (blk.cached && !blk.offloaded) out->push_back(b);
  }
}

}  // namespace inferd
