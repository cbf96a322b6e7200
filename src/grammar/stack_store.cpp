#include "grammar/stack_store.h"

#include <algorithm>

#include "common/check.h"

namespace inferd {

void U64Map::resize(size_t capacity) {
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<uint32_t> old_values = std::move(values_);
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, 0);
  mask_ = capacity - 1;
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] != kEmpty) insert(old_keys[i], old_values[i]);
  }
}

void U64Map::insert(uint64_t key, uint32_t value) {
  if ((size_ + 1) * 2 > keys_.size()) resize(keys_.size() * 2);
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) {
      values_[i] = value;
      return;
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = value;
      ++size_;
      return;
    }
  }
}

namespace {

constexpr size_t kSetBuckets = 1 << 12;

uint64_t hash_stacks(const std::vector<uint32_t>& stacks) {
  uint64_t h = 0x9E3779B97F4A7C15ULL;
  for (uint32_t s : stacks) {
    h ^= s + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
  }
  return h;
}

}  // namespace

StackStore::StackStore(const Grammar& grammar) : grammar_(grammar), set_buckets_(kSetBuckets) {
  frames_.push_back({0, 0});  // the empty stack
  after_.push_back(-1);
  make_set({});  // kDeadSet
}

uint32_t StackStore::push(uint32_t position, uint32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(position) << 32) | parent;
  if (const uint32_t* id = frame_ids_.find(key)) return *id;
  const auto id = static_cast<uint32_t>(frames_.size());
  frames_.push_back({position, parent});
  after_.push_back(-1);
  frame_ids_.insert(key, id);
  return id;
}

uint32_t StackStore::make_set(std::vector<uint32_t> stacks) {
  return intern_set(&stacks);
}

std::string StackStore::overflow_message() {
  return "the output grammar is too ambiguous: more than " + std::to_string(kMaxStacksPerSet) +
         " parses of the output alive at once, more than " + std::to_string(kMaxStoredIds >> 18) +
         " MiB of parser states, or more than " + std::to_string(kMaxWorkPerToken) +
         " parser steps for one token";
}

uint32_t StackStore::intern_set(std::vector<uint32_t>* stacks) {
  work_ += stacks->size();
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
  const uint64_t h = hash_stacks(*stacks);
  auto& bucket = set_buckets_[h & (kSetBuckets - 1)];
  for (const auto& [hash, id] : bucket) {
    if (hash == h && sets_[id] == *stacks) return id;
  }
  if (stacks->size() > kMaxStacksPerSet || stored_ids() + stacks->size() > kMaxStoredIds) {
    ++overflows_;
    return kDeadSet;
  }
  stored_ids_ += stacks->size();
  const auto id = static_cast<uint32_t>(sets_.size());
  ByteSet first;
  for (uint32_t s : *stacks) {
    if (s == kEmptyStack) continue;
    const GrammarElement& e = grammar_.element(frames_[s].position);
    INFERD_CHECK(e.kind == GrammarElementKind::kBytes);
    const ByteSet& b = grammar_.byte_set(e.value);
    for (size_t w = 0; w < first.words.size(); ++w) first.words[w] |= b.words[w];
  }
  sets_.push_back(*stacks);
  first_bytes_.push_back(first);
  ends_.push_back(!stacks->empty() && (*stacks)[0] == kEmptyStack ? 1 : 0);
  hot_.push_back(-1);
  uses_.push_back(0);
  bucket.emplace_back(h, id);
  return id;
}

uint32_t StackStore::make_stack(std::span<const uint32_t> positions_top_first) {
  uint32_t stack = kEmptyStack;
  for (size_t i = positions_top_first.size(); i-- > 0;) stack = push(positions_top_first[i], stack);
  return stack;
}

void StackStore::expand(uint32_t stack, std::vector<uint32_t>* out) {
  // Iterative, and each stack expanded once per call: stacks are interned, so a stack reached
  // again adds nothing new. Without this, nullable rules nested in a repetition reach the same
  // stacks along exponentially many paths (the fuzzed regex `(|||a){0,88}` ran for minutes), and a
  // long chain of rules nests as deep as it is long.
  if (++expand_epoch_ == 0) {
    std::fill(expanded_.begin(), expanded_.end(), 0);
    expand_epoch_ = 1;
  }
  expand_work_.assign(1, stack);
  while (!expand_work_.empty()) {
    const uint32_t s = expand_work_.back();
    expand_work_.pop_back();
    ++work_;
    if (s >= expanded_.size()) expanded_.resize(frames_.size(), 0);
    if (expanded_[s] == expand_epoch_) continue;
    expanded_[s] = expand_epoch_;
    if (s == kEmptyStack) {
      out->push_back(s);
      continue;
    }
    const Frame f = frames_[s];
    const GrammarElement& e = grammar_.element(f.position);
    switch (e.kind) {
      case GrammarElementKind::kBytes: out->push_back(s); break;
      case GrammarElementKind::kEnd: expand_work_.push_back(f.parent); break;
      case GrammarElementKind::kRule: {
        // Tail call: a reference that ends its alternative leaves no frame to return to.
        const uint32_t base = grammar_.element(f.position + 1).kind == GrammarElementKind::kEnd
                                  ? f.parent
                                  : push(f.position + 1, f.parent);
        for (uint32_t alt : grammar_.rules()[e.value].alternatives) {
          expand_work_.push_back(grammar_.element(alt).kind == GrammarElementKind::kEnd ? base
                                                                                        : push(alt, base));
        }
        break;
      }
    }
  }
}

uint32_t StackStore::initial_set() {
  scratch_.clear();
  expand(push(Grammar::kStartPosition, kEmptyStack), &scratch_);
  return make_set(scratch_);
}

std::span<const uint32_t> StackStore::after_terminal(uint32_t stack) {
  if (after_[stack] < 0) {
    const Frame f = frames_[stack];
    std::vector<uint32_t> out;
    if (grammar_.element(f.position + 1).kind == GrammarElementKind::kEnd) {
      expand(f.parent, &out);
    } else {
      expand(push(f.position + 1, f.parent), &out);
    }
    after_[stack] = static_cast<int32_t>(afters_.size());  // after push(): after_ may have grown
    stored_ids_ += out.size();
    afters_.push_back(std::move(out));
  }
  return afters_[static_cast<size_t>(after_[stack])];
}

uint32_t StackStore::step_slow(uint32_t set, uint8_t byte) {
  const uint64_t key = (static_cast<uint64_t>(set) << 8) | byte;
  if (hot_[set] < 0 && ++uses_[set] == kHotAfter) {
    hot_[set] = static_cast<int32_t>(hot_steps_.size() / 256);
    hot_steps_.resize(hot_steps_.size() + 256, kUnknown);
  }
  auto remember = [&](uint32_t next) {
    if (hot_[set] >= 0) hot_steps_[static_cast<size_t>(hot_[set]) * 256 + byte] = next;
    return next;
  };
  // No top terminal takes the byte: rejected without a table entry (most bytes, for most sets).
  if (!first_bytes_[set].test(byte)) return remember(kDeadSet);
  if (const uint32_t* next = steps_.find(key)) return remember(*next);
  step_scratch_.clear();
  work_ += sets_[set].size();
  // sets_[set] stays put below: after_terminal() grows frames_ and afters_, not sets_.
  for (uint32_t s : sets_[set]) {
    if (s == kEmptyStack) continue;
    const GrammarElement& e = grammar_.element(frames_[s].position);
    if (!grammar_.byte_set(e.value).test(byte)) continue;
    const auto after = after_terminal(s);
    step_scratch_.insert(step_scratch_.end(), after.begin(), after.end());
    work_ += after.size();
  }
  const uint64_t overflows = overflows_;
  const uint32_t next = step_scratch_.empty() ? kDeadSet : intern_set(&step_scratch_);
  if (overflows_ != overflows) return kDeadSet;  // not a rejection: nothing memoized
  steps_.insert(key, next);
  return remember(next);
}

uint32_t StackStore::step_bytes(uint32_t set, std::string_view bytes) {
  for (char c : bytes) {
    if (set == kDeadSet) return set;
    set = step(set, static_cast<uint8_t>(c));
  }
  return set;
}

}  // namespace inferd
