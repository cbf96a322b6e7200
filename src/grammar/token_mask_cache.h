// TokenMaskCache: the context-independent part of token masks (xgrammar's "adaptive token mask
// cache"), one per (grammar, vocabulary), shared by every matcher of that grammar. GrammarMatcher
// asks it for each live stack of its state and checks only the "uncertain" tokens itself.
//
// The key of a stack is its top kKeyFrames frames. Walking the token trie from those frames alone
// (over an empty stack below them), a token is
//   accepted  when some path consumes all its bytes inside them (true whatever lies below),
//   uncertain when no path does but some path completes the frames with bytes left over (the
//             stack below decides: the matcher checks these against the full stack),
//   rejected  otherwise.
// A stack no deeper than the key has nothing below: its leftover-bytes tokens are rejected.
//
// Short tokens (kShortTokenBytes or fewer) parse alike from a key and from its positions mapped by
// Grammar::short_token_position(), so a key that maps to another takes that key's mask (one trie
// walk shared by, e.g., every rank of an x{0,40} chain) and walks only the long tokens itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_vocab.h"
#include "grammar/stack_store.h"

namespace inferd {

struct ContextMask {
  std::vector<uint32_t> accepted;       // bitmask [vocab.num_mask_words()], bit id = accepted
  std::vector<int32_t> uncertain;       // ids, in trie (byte) order
  std::vector<uint16_t> uncertain_lcp;  // bytes each shares with the previous uncertain id
};

class TokenMaskCache final {
 public:
  static constexpr int kKeyFrames = 3;

  // grammar: not owned (the Grammar owns this cache); vocab: shared.
  TokenMaskCache(const Grammar& grammar, std::shared_ptr<const GrammarVocab> vocab);

  // The mask of `stack` of `store` (a matcher's) without the frames below its key. Computed on
  // first use of the key (a trie walk), then shared. Thread-safe. nullptr when the walk overflowed
  // the cache's StackStore (a grammar too ambiguous to follow; nothing is cached then).
  // `work_left`: the caller's budget of StackStore::work() for a walk; a walk that would exceed it
  // stops and answers nullptr too. What a walk used is taken off it.
  std::shared_ptr<const ContextMask> get(const StackStore& store, uint32_t stack, uint64_t* work_left);

  size_t num_entries() const;

 private:
  using Key = std::vector<uint32_t>;  // top positions, then 1 if that is the whole stack
  std::shared_ptr<const ContextMask> find_or_compute(const Key& key);
  // The whole-trie walk from the key's frames.
  std::shared_ptr<const ContextMask> compute(const Key& key);
  // `base` (the short-token key's mask) with the long tokens walked from the key's frames.
  std::shared_ptr<const ContextMask> with_long_tokens(const ContextMask& base, const Key& key);
  uint32_t initial_set(const Key& key);
  bool overflowed();  // the walk just made hit the store's bounds (and clears that)
  void sort_uncertain(ContextMask* mask) const;

  static constexpr size_t kMaxEntries = 1 << 14;
  const Grammar& grammar_;
  std::shared_ptr<const GrammarVocab> vocab_;
  mutable std::mutex mutex_;  // guards everything below
  std::unique_ptr<StackStore> store_;
  std::map<Key, std::shared_ptr<const ContextMask>> entries_;
  std::vector<uint32_t> walk_states_;  // scratch of the walks
  std::vector<uint8_t> walk_done_;
  uint64_t walk_end_ = 0;  // the store's work() past which the current walk stops
};

}  // namespace inferd
