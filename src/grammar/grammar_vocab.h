// GrammarVocab: a tokenizer's vocabulary as the grammar matcher sees it, built once per tokenizer:
// each id's raw bytes, which ids are special (never allowed by a grammar) and which end generation
// (allowed exactly where the grammar can end), and the byte trie of the other tokens that token
// masks are computed by. Immutable; thread-safe to share (std::shared_ptr<const GrammarVocab>).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace inferd {

// The tokens (neither special nor end, non-empty) in a trie flattened in depth-first order:
//
//   node i: byte(i) at depth(i) (1 = a token's first byte); its subtree is nodes [i, subtree_end(i));
//   the tokens whose bytes end at node i are token_ids()[token_begin(i), token_begin(i + 1)),
//   so the tokens of a subtree are token_ids()[token_begin(i), token_begin(subtree_end(i))).
//
// A mask walk visits the nodes in order, stepping the parser state of node i's parent (the nearest
// node before i of depth(i) - 1) by byte(i), and jumps to subtree_end(i) when it is rejected.
struct TokenTrie {
  std::vector<uint8_t> bytes;
  std::vector<uint16_t> depths;
  std::vector<uint32_t> subtree_ends;
  std::vector<uint32_t> token_begins;  // num_nodes + 1 entries
  std::vector<int32_t> token_ids;
  int max_depth = 0;
  size_t num_nodes() const { return bytes.size(); }
};

// Tokens of at most this many bytes are "short": TokenMaskCache may key their masks by a grammar's
// short_token_position(); the (few) longer ones it checks from the exact key.
inline constexpr size_t kShortTokenBytes = 16;

struct GrammarVocabSpec {
  std::vector<std::string> token_bytes;  // [vocab size]: raw bytes of each id (byte-level BPE decoded)
  std::vector<int32_t> special_ids;      // control tokens: never allowed (unless also end ids)
  std::vector<int32_t> end_ids;          // EOS / EOT: allowed exactly where the grammar can end
};

class GrammarVocab final {
 public:
  // Error when an id is out of range or no token is left for grammars.
  static Expected<std::shared_ptr<const GrammarVocab>> create(GrammarVocabSpec spec);

  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  const std::string& token_bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  bool is_end(int32_t id) const { return kinds_[static_cast<size_t>(id)] == Kind::kEnd; }
  // Never allowed by a grammar: special (and not an end id), or no bytes.
  bool is_excluded(int32_t id) const { return kinds_[static_cast<size_t>(id)] == Kind::kExcluded; }
  std::span<const int32_t> end_ids() const { return end_ids_; }
  const TokenTrie& trie() const { return trie_; }
  // The trie's tokens longer than kShortTokenBytes, in trie (byte) order; the bytes each shares
  // with the one before it; and their bitmask [num_mask_words()].
  std::span<const int32_t> long_tokens() const { return long_tokens_; }
  std::span<const uint16_t> long_token_lcp() const { return long_token_lcp_; }
  std::span<const uint32_t> long_token_mask() const { return long_token_mask_; }
  // Words of a bitmask over the vocabulary: (size() + 31) / 32.
  size_t num_mask_words() const { return (token_bytes_.size() + 31) / 32; }

  GrammarVocab(const GrammarVocab&) = delete;
  GrammarVocab& operator=(const GrammarVocab&) = delete;

 private:
  enum class Kind : uint8_t { kText, kEnd, kExcluded };
  GrammarVocab() = default;
  void build_trie();

  std::vector<std::string> token_bytes_;
  std::vector<Kind> kinds_;
  std::vector<int32_t> end_ids_;
  TokenTrie trie_;
  std::vector<int32_t> long_tokens_;
  std::vector<uint16_t> long_token_lcp_;
  std::vector<uint32_t> long_token_mask_;
};

}  // namespace inferd
