#include "grammar/token_mask_cache.h"

#include <algorithm>

namespace inferd {

TokenMaskCache::TokenMaskCache(const Grammar& grammar, std::shared_ptr<const GrammarVocab> vocab)
    : grammar_(grammar), vocab_(std::move(vocab)), store_(std::make_unique<StackStore>(grammar)) {}

size_t TokenMaskCache::num_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::shared_ptr<const ContextMask> TokenMaskCache::get(const StackStore& store, uint32_t stack,
                                                       uint64_t* work_left) {
  Key key;
  uint32_t s = stack;
  while (s != StackStore::kEmptyStack && key.size() < static_cast<size_t>(kKeyFrames)) {
    key.push_back(store.position(s));
    s = store.parent(s);
  }
  key.push_back(s == StackStore::kEmptyStack ? 1 : 0);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  Key short_key = key;
  for (size_t i = 0; i + 1 < short_key.size(); ++i) short_key[i] = grammar_.short_token_position(key[i]);
  uint64_t used = 0;
  auto walk = [&]() -> std::shared_ptr<const ContextMask> {
    const uint64_t start = store_->work();
    walk_end_ = start + (*work_left > used ? *work_left - used : 0);
    std::shared_ptr<const ContextMask> m;
    if (short_key == key) {
      m = compute(key);
    } else {
      const std::shared_ptr<const ContextMask> base = find_or_compute(short_key);
      if (base != nullptr) m = with_long_tokens(*base, key);
    }
    used += store_->work() - start;
    return m;
  };
  std::shared_ptr<const ContextMask> mask = walk();
  if (mask == nullptr && used < *work_left) {
    // The store is only the walks' scratch and lives as long as the grammar: it may have filled
    // up with the states of earlier walks. A walk that overflows a fresh store, or runs past the
    // work bound on one, is the grammar's.
    store_ = std::make_unique<StackStore>(grammar_);
    mask = walk();
  }
  *work_left -= std::min(used, *work_left);
  if (mask == nullptr) return nullptr;
  if (entries_.size() >= kMaxEntries) entries_.clear();
  entries_.emplace(std::move(key), mask);
  return mask;
}

std::shared_ptr<const ContextMask> TokenMaskCache::find_or_compute(const Key& key) {
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  auto mask = compute(key);
  if (mask == nullptr) return nullptr;
  if (entries_.size() >= kMaxEntries) entries_.clear();
  entries_.emplace(key, mask);
  return mask;
}

// An overflow during a walk makes its mask wrong; the store's own tables stay valid (an overflow
// memoizes nothing), so the next walk starts clean.
bool TokenMaskCache::overflowed() {
  const bool overflowed = store_->overflowed();
  store_->clear_overflow();
  return overflowed;
}

uint32_t TokenMaskCache::initial_set(const Key& key) {
  const std::vector<uint32_t> positions(key.begin(), key.end() - 1);
  return store_->make_set({store_->make_stack(positions)});
}

// One depth-first walk of the trie, stepping the parser from the key's frames: states[d] is the
// set after the first d bytes of the current path, done[d] whether some path has completed the
// frames within those bytes (so bytes the frames reject may belong to the stack below).
std::shared_ptr<const ContextMask> TokenMaskCache::compute(const Key& key) {
  const bool whole_stack = key.back() != 0;
  auto mask = std::make_shared<ContextMask>();
  mask->accepted.assign(vocab_->num_mask_words(), 0);
  const TokenTrie& t = vocab_->trie();
  walk_states_.resize(static_cast<size_t>(t.max_depth) + 1);
  walk_done_.resize(static_cast<size_t>(t.max_depth) + 1);
  uint32_t* states = walk_states_.data();
  uint8_t* done = walk_done_.data();
  states[0] = initial_set(key);
  done[0] = store_->can_end(states[0]) ? 1 : 0;
  const size_t n = t.num_nodes();
  const uint8_t* bytes = t.bytes.data();
  const uint16_t* depths = t.depths.data();
  const uint32_t* token_begins = t.token_begins.data();
  const int32_t* token_ids = t.token_ids.data();
  uint32_t* accepted = mask->accepted.data();
  for (size_t i = 0; i < n;) {
    if (store_->work() > walk_end_) return nullptr;
    const size_t d = depths[i];
    const uint32_t next = store_->step(states[d - 1], bytes[i]);
    if (next == StackStore::kDeadSet) {
      if (store_->overflowed()) break;
      if (done[d - 1] != 0 && !whole_stack) {
        for (uint32_t k = token_begins[i]; k < token_begins[t.subtree_ends[i]]; ++k) {
          mask->uncertain.push_back(token_ids[k]);
        }
      }
      i = t.subtree_ends[i];
      continue;
    }
    states[d] = next;
    done[d] = (done[d - 1] | (store_->can_end(next) ? 1 : 0));
    for (uint32_t k = token_begins[i]; k < token_begins[i + 1]; ++k) {
      const auto id = static_cast<uint32_t>(token_ids[k]);
      accepted[id >> 5] |= 1u << (id & 31);
    }
    ++i;
  }
  if (overflowed()) return nullptr;
  sort_uncertain(mask.get());
  return mask;
}

// The short tokens as `base` has them; each long token walked from the key's frames (in byte
// order, reusing the states of the prefix it shares with the one before).
std::shared_ptr<const ContextMask> TokenMaskCache::with_long_tokens(const ContextMask& base, const Key& key) {
  const bool whole_stack = key.back() != 0;
  auto mask = std::make_shared<ContextMask>();
  const std::span<const uint32_t> long_mask = vocab_->long_token_mask();
  mask->accepted.resize(base.accepted.size());
  for (size_t w = 0; w < base.accepted.size(); ++w) mask->accepted[w] = base.accepted[w] & ~long_mask[w];
  for (int32_t id : base.uncertain) {
    if (vocab_->token_bytes(id).size() <= kShortTokenBytes) mask->uncertain.push_back(id);
  }
  const std::span<const int32_t> ids = vocab_->long_tokens();
  const std::span<const uint16_t> lcp = vocab_->long_token_lcp();
  walk_states_.resize(static_cast<size_t>(vocab_->trie().max_depth) + 1);
  walk_done_.resize(walk_states_.size());
  walk_states_[0] = initial_set(key);
  walk_done_[0] = store_->can_end(walk_states_[0]) ? 1 : 0;
  size_t valid = 0;  // walk_states_[0..valid] hold the previous token's prefix states
  for (size_t j = 0; j < ids.size(); ++j) {
    if (store_->work() > walk_end_) return nullptr;
    const int32_t id = ids[j];
    const std::string& bytes = vocab_->token_bytes(id);
    size_t d = std::min<size_t>(valid, lcp[j]);
    bool rejected_here = false;
    while (d < bytes.size()) {
      const uint32_t next = store_->step(walk_states_[d], static_cast<uint8_t>(bytes[d]));
      if (next == StackStore::kDeadSet) {
        if (store_->overflowed()) {
          store_->clear_overflow();
          return nullptr;
        }
        rejected_here = true;
        break;
      }
      walk_states_[d + 1] = next;
      walk_done_[d + 1] = (walk_done_[d] | (store_->can_end(next) ? 1 : 0));
      ++d;
    }
    valid = d;
    if (!rejected_here) {
      mask->accepted[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    } else if (walk_done_[d] != 0 && !whole_stack) {
      mask->uncertain.push_back(id);
    }
  }
  if (overflowed()) return nullptr;
  sort_uncertain(mask.get());
  return mask;
}

// Uncertain ids in byte order (the matcher walks them sharing prefixes), with those prefixes.
void TokenMaskCache::sort_uncertain(ContextMask* mask) const {
  auto& u = mask->uncertain;
  std::sort(u.begin(), u.end(), [&](int32_t a, int32_t b) {
    const std::string& x = vocab_->token_bytes(a);
    const std::string& y = vocab_->token_bytes(b);
    return x != y ? x < y : a < b;
  });
  mask->uncertain_lcp.assign(u.size(), 0);
  for (size_t j = 1; j < u.size(); ++j) {
    const std::string& a = vocab_->token_bytes(u[j - 1]);
    const std::string& b = vocab_->token_bytes(u[j]);
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    mask->uncertain_lcp[j] = static_cast<uint16_t>(l);
  }
}

}  // namespace inferd
