#include "grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>

namespace inferd {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                               std::shared_ptr<const GrammarVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  context_masks_ = grammar_->token_mask_cache(vocab_);
  reset();
}

void GrammarMatcher::reset() {
  store_ = std::make_unique<StackStore>(*grammar_);
  state_masks_.clear();
  start_token_work();
  history_.assign(1, State{store_->initial_set(), false});
  check_overflow();
}

bool GrammarMatcher::check_overflow(bool cache_failed) {
  if (cache_failed || store_->overflowed() || token_work() > StackStore::kMaxWorkPerToken) failed_ = true;
  return failed_;
}

std::string GrammarMatcher::error() const {
  return failed_ ? StackStore::overflow_message() : std::string();
}

bool GrammarMatcher::can_end() const {
  const State& s = history_.back();
  return !failed_ && !s.ended && store_->can_end(s.set);
}

bool GrammarMatcher::is_terminated() const {
  const State& s = history_.back();
  if (s.ended) return true;
  const auto stacks = store_->stacks(s.set);
  return stacks.size() == 1 && stacks[0] == StackStore::kEmptyStack;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (failed_ || id < 0 || id >= vocab_->size() || history_.back().ended) return false;
  if (vocab_->is_end(id)) {
    if (!can_end()) return false;
    history_.push_back({history_.back().set, true});
    return true;
  }
  if (vocab_->is_excluded(id)) return false;
  start_token_work();
  const uint32_t next = store_->step_bytes(history_.back().set, vocab_->token_bytes(id));
  if (check_overflow() || next == StackStore::kDeadSet) return false;
  history_.push_back({next, false});
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (failed_ || history_.back().ended) return false;
  start_token_work();
  const uint32_t next = store_->step_bytes(history_.back().set, bytes);
  if (check_overflow() || next == StackStore::kDeadSet) return false;
  // Forced bytes are not a token: they replace the current state rather than add one.
  history_.back().set = next;
  return true;
}

Status GrammarMatcher::rollback(size_t num_tokens) {
  if (num_tokens >= history_.size()) {
    return invalid_argument("grammar matcher: rollback of " + std::to_string(num_tokens) +
                            " tokens past the " + std::to_string(history_.size() - 1) + " accepted");
  }
  history_.resize(history_.size() - num_tokens);
  return Status::ok();
}

void GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> bitmask) {
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  const State& s = history_.back();
  if (failed_ || s.ended) return;
  auto it = state_masks_.find(s.set);
  if (it == state_masks_.end()) {
    if (state_masks_.size() >= kMaxCachedStates) state_masks_.clear();
    std::vector<uint32_t> mask(vocab_->num_mask_words(), 0);
    start_token_work();
    compute_mask(&mask);
    if (failed_) return;  // the bitmask stays empty
    it = state_masks_.emplace(s.set, std::move(mask)).first;
  }
  const size_t n = std::min(bitmask.size(), it->second.size());
  std::memcpy(bitmask.data(), it->second.data(), n * sizeof(uint32_t));
}

// The union over the state's stacks of each one's mask: the cached context-independent part, then
// the uncertain tokens checked against the whole stack; end ids where the grammar can end.
void GrammarMatcher::compute_mask(std::vector<uint32_t>* mask) {
  const uint32_t set = history_.back().set;
  const std::vector<uint32_t> stacks(store_->stacks(set).begin(), store_->stacks(set).end());
  for (uint32_t stack : stacks) {
    if (stack == StackStore::kEmptyStack) continue;
    const uint64_t spent = token_work();
    uint64_t left = spent < StackStore::kMaxWorkPerToken ? StackStore::kMaxWorkPerToken - spent : 0;
    const uint64_t offered = left;
    const std::shared_ptr<const ContextMask> cm = context_masks_->get(*store_, stack, &left);
    cache_work_ += offered - left;
    if (check_overflow(cm == nullptr)) return;
    uint32_t* out = mask->data();
    const uint32_t* in = cm->accepted.data();
    for (size_t w = 0; w < mask->size(); ++w) out[w] |= in[w];
    if (!cm->uncertain.empty()) add_uncertain(stack, *cm, mask);
    if (check_overflow()) return;
  }
  if (store_->can_end(set)) {
    for (int32_t id : vocab_->end_ids()) (*mask)[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  }
}

// Walks the uncertain tokens in byte order from the full stack, reusing the states of the prefix
// each shares with the previous one.
void GrammarMatcher::add_uncertain(uint32_t stack, const ContextMask& cm, std::vector<uint32_t>* mask) {
  walk_states_.resize(static_cast<size_t>(vocab_->trie().max_depth) + 1);
  walk_states_[0] = store_->make_set({stack});
  size_t valid = 0;  // walk_states_[0..valid] hold the previous token's prefix states
  for (size_t j = 0; j < cm.uncertain.size(); ++j) {
    const int32_t id = cm.uncertain[j];
    valid = std::min<size_t>(valid, cm.uncertain_lcp[j]);
    uint32_t& word = (*mask)[static_cast<size_t>(id) >> 5];
    const uint32_t bit = 1u << (id & 31);
    if (word & bit) continue;
    if (token_work() > StackStore::kMaxWorkPerToken) return;  // compute_mask() fails
    const std::string& bytes = vocab_->token_bytes(id);
    size_t d = valid;
    while (d < bytes.size()) {
      const uint32_t next = store_->step(walk_states_[d], static_cast<uint8_t>(bytes[d]));
      if (next == StackStore::kDeadSet) {
        if (store_->overflowed()) return;  // compute_mask() records the failure
        break;
      }
      walk_states_[++d] = next;
    }
    valid = d;
    if (d == bytes.size()) word |= bit;
  }
}

}  // namespace inferd
