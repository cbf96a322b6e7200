#include "kv/block_pool.h"

#include <algorithm>

#include "common/check.h"

namespace inferd {

BlockPool::BlockPool(int32_t num_blocks) : blocks_(static_cast<size_t>(num_blocks)) {
  INFERD_CHECK(num_blocks > 0);
  for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
  size_t slots = 16;
  while (slots < 2 * static_cast<size_t>(num_blocks)) slots *= 2;
  slots_.assign(slots, -1);
  slot_mask_ = slots - 1;
}

int64_t BlockPool::find_slot(const BlockHash& hash) const {
  for (size_t i = home_slot(hash);; i = (i + 1) & slot_mask_) {
    const int32_t b = slots_[i];
    if (b < 0) return -1;
    if (blocks_[static_cast<size_t>(b)].hash == hash) return static_cast<int64_t>(i);
  }
}

void BlockPool::index_insert(int32_t block) {
  size_t i = home_slot(blocks_[static_cast<size_t>(block)].hash);
  while (slots_[i] >= 0) i = (i + 1) & slot_mask_;
  slots_[i] = block;
  ++num_cached_;
}

void BlockPool::index_erase(const BlockHash& hash) {
  const int64_t found = find_slot(hash);
  INFERD_CHECK(found >= 0);
  // Backward-shift deletion: later entries of the probe run move up into the hole when their
  // home slot does not lie (cyclically) after it, so that every lookup still finds its key
  // before an empty slot.
  auto hole = static_cast<size_t>(found);
  for (size_t j = (hole + 1) & slot_mask_; slots_[j] >= 0; j = (j + 1) & slot_mask_) {
    const size_t home = home_slot(blocks_[static_cast<size_t>(slots_[j])].hash);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole] = -1;
  --num_cached_;
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
    index_erase(blk.hash);
    blk.cached = false;
    blk.offloaded = false;
  }
  return b;
}

void BlockPool::cache_block(int32_t block, const BlockHash& hash) {
  Block& blk = blocks_[static_cast<size_t>(block)];
  INFERD_CHECK(blk.ref_count > 0);
  if (blk.cached || find_slot(hash) >= 0) return;
  blk.cached = true;
  blk.hash = hash;
  index_insert(block);
}

int32_t BlockPool::find_cached(const BlockHash& hash) const {
  const int64_t i = find_slot(hash);
  return i < 0 ? -1 : slots_[static_cast<size_t>(i)];
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
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  if (!allocate(n, &out)) return std::nullopt;
  return out;
}

bool BlockPool::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n < 0 || n > num_free_) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = pop_free();
    INFERD_CHECK(blocks_[static_cast<size_t>(b)].ref_count == 0);
    blocks_[static_cast<size_t>(b)].ref_count = 1;
    out->push_back(b);
  }
  return true;
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
