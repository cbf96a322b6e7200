// GrammarMatcher: one sequence's position in its grammar. The sampler asks it for the bitmask of
// allowed next tokens, masks the logits, samples, and tells it the token; the grammar then
// advances by the token's bytes. One per sequence, used on the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_vocab.h"
#include "grammar/stack_store.h"
#include "grammar/token_mask_cache.h"

namespace inferd {

// Bitmask layout: token id t is bit (t % 32) of word t / 32 (word bit 0 = least significant), a
// set bit meaning "allowed" (xgrammar's and vLLM's int32 bitmask). Ids past the vocabulary (a
// logits row padded beyond it) are never allowed.
class GrammarMatcher final {
 public:
  // Both shared: the grammar and vocabulary outlive nothing in particular.
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab);

  // Words a bitmask over `num_logits` ids needs: (num_logits + 31) / 32.
  static size_t bitmask_words(size_t num_logits) { return (num_logits + 31) / 32; }

  // Writes the allowed-token bitmask of the current state over bitmask.size() * 32 ids (pass
  // bitmask_words(num_logits) words or more). End ids are allowed where the grammar can end; after
  // an end token, nothing is. Non-const: it fills the matcher's caches.
  void fill_next_token_bitmask(std::span<uint32_t> bitmask);

  // Advances by token `id`; false (state unchanged) when it is not allowed here.
  [[nodiscard]] bool accept_token(int32_t id);
  // Advances by raw bytes (e.g. text the caller forces); false (state unchanged) when rejected.
  [[nodiscard]] bool accept_bytes(std::string_view bytes);

  // The bytes so far form a complete sentence of the grammar.
  bool can_end() const;
  // An end token was accepted, or nothing but the end can follow.
  bool is_terminated() const;

  // Undoes the last `num_tokens` accepted tokens (speculative decoding); error past the start.
  [[nodiscard]] Status rollback(size_t num_tokens);
  // Back to the start of the grammar.
  void reset();

  // The grammar proved too ambiguous to follow within StackStore's bounds (more parses alive at
  // once than kMaxStacksPerSet, or too much parser state): the matcher allows no token and accepts
  // none from then on (rollback() and reset() do not clear it), and the request must fail with
  // error() rather than read the empty mask as the grammar's own dead end.
  bool failed() const { return failed_; }
  std::string error() const;
  // The parser work (StackStore::work()) of the last mask computed or token accepted: the
  // matcher's own store's, and the walks it asked of the shared cache. Failure comes past
  // StackStore::kMaxWorkPerToken.
  uint64_t token_work() const { return store_->work() - work_start_ + cache_work_; }
  // Stack ids the matcher's own store holds (StackStore::stored_ids(), bounded by kMaxStoredIds).
  size_t stored_ids() const { return store_->stored_ids(); }
  size_t num_accepted_tokens() const { return history_.size() - 1; }

 private:
  struct State {
    uint32_t set;
    bool ended;  // an end token was accepted
  };
  void compute_mask(std::vector<uint32_t>* mask);
  // Records an overflow of the matcher's store (or the shared cache's, `cache_failed`), or this
  // token's work past StackStore::kMaxWorkPerToken, as failure.
  bool check_overflow(bool cache_failed = false);
  void add_uncertain(uint32_t stack, const ContextMask& cm, std::vector<uint32_t>* mask);

  static constexpr size_t kMaxCachedStates = 64;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const GrammarVocab> vocab_;
  std::shared_ptr<TokenMaskCache> context_masks_;
  std::unique_ptr<StackStore> store_;
  std::vector<State> history_;                                       // history_.back(): the current state
  std::unordered_map<uint32_t, std::vector<uint32_t>> state_masks_;  // set id -> whole mask
  std::vector<uint32_t> walk_states_;                                // scratch of add_uncertain
  bool failed_ = false;
  // This token's parser work: its mask or step in the matcher's store, and the walks it asked
  // of the shared cache.
  void start_token_work() {
    work_start_ = store_->work();
    cache_work_ = 0;
  }
  uint64_t work_start_ = 0;
  uint64_t cache_work_ = 0;
};

}  // namespace inferd
