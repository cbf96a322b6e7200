// StackStore: the pushdown recognizer's states, interned. A parse position is a stack of grammar
// positions; the matcher's state is the set of stacks still alive (the grammar may be ambiguous).
// Both are hash-consed to small ids, so equal states have equal ids, and a byte step of a state
// is memoized: after warm-up, stepping is one table lookup. Owned by one thread (a matcher, or a
// TokenMaskCache under its mutex).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace inferd {

// uint64 -> uint32 open-addressing hash map (keys never ~0); the store's memo tables.
class U64Map final {
 public:
  U64Map() { resize(1024); }
  const uint32_t* find(uint64_t key) const {
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  void insert(uint64_t key, uint32_t value);
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void resize(size_t capacity);
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  size_t mask_ = 0, size_ = 0;
};

//   stack id: a frame (grammar position, parent stack id); id 0 is the empty stack (the start
//             rule is complete). The top frame of a live stack is always at a kBytes element; the
//             frames below hold the position to continue at when the rule above completes.
//   set id:   a sorted set of stack ids; id 0 is the empty set (the input is rejected).
class StackStore final {
 public:
  static constexpr uint32_t kEmptyStack = 0;
  static constexpr uint32_t kDeadSet = 0;
  // Bounds on what an ambiguous grammar may cost (docs/grammar.md). A state holding more stacks
  // than kMaxStacksPerSet, or a store holding more than kMaxStoredIds stack ids in its frames and
  // sets, is not made: the operation answers kDeadSet and overflowed() turns true. Unambiguous
  // grammars (JSON schemas, choices) hold a handful of stacks; `[a-z]{0,2000}[a-z]{0,2000}` 2,002.
  static constexpr size_t kMaxStacksPerSet = 1 << 14;
  static constexpr size_t kMaxStoredIds = size_t{1} << 25;  // 128 MiB of ids
  // And a bound on time: the work() of one token's mask and step in a matcher, or of one walk of
  // TokenMaskCache, past which the grammar is refused the same way (docs/grammar.md).
  static constexpr uint64_t kMaxWorkPerToken = uint64_t{1} << 22;

  explicit StackStore(const Grammar& grammar);  // grammar: not owned, outlives the store

  // The state before any input.
  uint32_t initial_set();
  // The state after `byte` from `set` (kDeadSet: rejected). Memoized: a set stepped often gets a
  // 256-entry table of its own (trie walks step a few hot sets most of the time), others share a
  // hash table.
  uint32_t step(uint32_t set, uint8_t byte) {
    const int32_t hot = hot_[set];
    if (hot >= 0) {
      const uint32_t next = hot_steps_[static_cast<size_t>(hot) * 256 + byte];
      if (next != kUnknown) return next;
    }
    return step_slow(set, byte);
  }
  // The state after `bytes`; kDeadSet as soon as one is rejected.
  uint32_t step_bytes(uint32_t set, std::string_view bytes);
  std::span<const uint32_t> stacks(uint32_t set) const { return sets_[set]; }
  // Whether the input so far is a complete sentence (the empty stack is in the set).
  bool can_end(uint32_t set) const { return ends_[set] != 0; }

  // Stack frames, for TokenMaskCache's context-independent keys.
  uint32_t position(uint32_t stack) const { return frames_[stack].position; }
  uint32_t parent(uint32_t stack) const { return frames_[stack].parent; }
  // The stack (position, parent...) as given, top first, over the empty stack; its top must be a
  // kBytes element (interior frames: positions to continue at).
  uint32_t make_stack(std::span<const uint32_t> positions_top_first);
  // The set holding exactly these stacks (any order, duplicates allowed).
  uint32_t make_set(std::vector<uint32_t> stacks);

  size_t num_stacks() const { return frames_.size(); }
  size_t num_sets() const { return sets_.size(); }
  // Stack ids held (frames, sets, memoized expansions): what kMaxStoredIds bounds.
  size_t stored_ids() const { return stored_ids_ + frames_.size(); }

  // Some operation hit a bound above since the store was made (or since clear_overflow()); the
  // kDeadSet it answered then was not a rejection of the input, and no step result was memoized.
  bool overflowed() const { return overflows_ != 0; }
  // Stacks handled so far (expanded, scanned by a step, sorted into a set): the store's work, in
  // units that take roughly alike time. Callers budget it per token (GrammarMatcher) or per walk
  // (TokenMaskCache).
  uint64_t work() const { return work_; }
  void clear_overflow() { overflows_ = 0; }
  // The message for a request whose grammar overflowed.
  static std::string overflow_message();

 private:
  struct Frame {
    uint32_t position;
    uint32_t parent;
  };
  static constexpr uint32_t kUnknown = ~uint32_t{0};
  static constexpr uint32_t kHotAfter = 64;  // steps of a set before it gets its own table
  uint32_t step_slow(uint32_t set, uint8_t byte);
  // make_set() on a scratch vector: sorts and dedups it in place, copies it only when new.
  uint32_t intern_set(std::vector<uint32_t>* stacks);
  uint32_t push(uint32_t position, uint32_t parent);
  // Expands `stack` until every stack's top is a terminal (or the stack is empty).
  void expand(uint32_t stack, std::vector<uint32_t>* out);
  // The stacks after the top terminal of `stack` has matched a byte (memoized per stack).
  std::span<const uint32_t> after_terminal(uint32_t stack);

  const Grammar& grammar_;
  std::vector<Frame> frames_;
  U64Map frame_ids_;  // (position << 32 | parent) -> stack id
  std::vector<std::vector<uint32_t>> sets_;
  std::vector<ByteSet> first_bytes_;  // set -> the bytes its top terminals take (union)
  std::vector<uint8_t> ends_;         // set -> can_end()
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> set_buckets_;  // hash -> (hash, set id)
  U64Map steps_;                                                         // (set << 8 | byte) -> set
  std::vector<int32_t> hot_;         // set -> its table in hot_steps_, or -1
  std::vector<uint32_t> uses_;       // set -> slow steps so far
  std::vector<uint32_t> hot_steps_;  // [hot sets, 256]
  std::vector<int32_t> after_;       // stack -> index in afters_
  std::vector<std::vector<uint32_t>> afters_;
  std::vector<uint32_t> scratch_;
  std::vector<uint32_t> step_scratch_;
  std::vector<uint32_t> expand_work_;  // expand(): stacks still to expand
  std::vector<uint32_t> expanded_;     // stack -> the expand() call that reached it last
  uint32_t expand_epoch_ = 0;
  size_t stored_ids_ = 0;  // stack ids held by sets_ and afters_ (stored_ids() adds the frames)
  uint64_t overflows_ = 0;
  uint64_t work_ = 0;
};

}  // namespace inferd
