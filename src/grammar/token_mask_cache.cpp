#include "grammar/token_mask_cache.h"

#include <algorithm>

namespace inferd {

TokenMaskCache::TokenMaskCache(const Grammar& grammar, std::shared_ptr<const GrammarVocab> vocab)
    : vocab_(std::move(vocab)), store_(grammar) {}

size_t TokenMaskCache::num_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::shared_ptr<const ContextMask> TokenMaskCache::get(const StackStore& store, uint32_t stack) {
  std::vector<uint32_t> key;
  uint32_t s = stack;
  while (s != StackStore::kEmptyStack && key.size() < static_cast<size_t>(kKeyFrames)) {
    key.push_back(store.position(s));
    s = store.parent(s);
  }
  const bool whole_stack = s == StackStore::kEmptyStack;
  key.push_back(whole_stack ? 1 : 0);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  auto mask = compute(std::vector<uint32_t>(key.begin(), key.end() - 1), whole_stack);
  if (entries_.size() >= kMaxEntries) entries_.clear();
  entries_.emplace(std::move(key), mask);
  return mask;
}

// One depth-first walk of the trie, stepping the parser from the key's frames: states[d] is the
// set after the first d bytes of the current path, completed[d] whether some path has completed
// the frames before them.
std::shared_ptr<const ContextMask> TokenMaskCache::compute(const std::vector<uint32_t>& positions,
                                                           bool whole_stack) {
  auto mask = std::make_shared<ContextMask>();
  mask->accepted.assign(vocab_->num_mask_words(), 0);
  const TokenTrie& t = vocab_->trie();
  std::vector<uint32_t> states(static_cast<size_t>(t.max_depth) + 1);
  std::vector<uint8_t> completed(static_cast<size_t>(t.max_depth) + 1);
  states[0] = store_.make_set({store_.make_stack(positions)});
  completed[0] = 0;
  const size_t n = t.num_nodes();
  for (size_t i = 0; i < n;) {
    const size_t d = t.depths[i];
    const uint32_t parent = states[d - 1];
    const uint32_t next = store_.step(parent, t.bytes[i]);
    const bool done_before = completed[d - 1] != 0 || store_.can_end(parent);
    if (next == StackStore::kDeadSet) {
      if (done_before && !whole_stack) {
        for (uint32_t k = t.token_begins[i]; k < t.token_begins[t.subtree_ends[i]]; ++k) {
          mask->uncertain.push_back(t.token_ids[k]);
        }
      }
      i = t.subtree_ends[i];
      continue;
    }
    states[d] = next;
    completed[d] = done_before ? 1 : 0;
    for (uint32_t k = t.token_begins[i]; k < t.token_begins[i + 1]; ++k) {
      const auto id = static_cast<uint32_t>(t.token_ids[k]);
      mask->accepted[id >> 5] |= 1u << (id & 31);
      ++mask->num_accepted;
    }
    ++i;
  }
  mask->uncertain_lcp.resize(mask->uncertain.size());
  for (size_t j = 1; j < mask->uncertain.size(); ++j) {
    const std::string& a = vocab_->token_bytes(mask->uncertain[j - 1]);
    const std::string& b = vocab_->token_bytes(mask->uncertain[j]);
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    mask->uncertain_lcp[j] = static_cast<uint16_t>(l);
  }
  return mask;
}

}  // namespace inferd
