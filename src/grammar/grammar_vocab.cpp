#include "grammar/grammar_vocab.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace inferd {

Expected<std::shared_ptr<const GrammarVocab>> GrammarVocab::create(GrammarVocabSpec spec) {
  std::shared_ptr<GrammarVocab> v(new GrammarVocab());
  const auto n = static_cast<int64_t>(spec.token_bytes.size());
  if (n == 0 || n > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("grammar vocab: " + std::to_string(n) + " tokens");
  }
  v->token_bytes_ = std::move(spec.token_bytes);
  v->kinds_.assign(static_cast<size_t>(n), Kind::kText);
  for (size_t i = 0; i < v->token_bytes_.size(); ++i) {
    const size_t len = v->token_bytes_[i].size();
    if (len == 0 || len > std::numeric_limits<uint16_t>::max()) v->kinds_[i] = Kind::kExcluded;
  }
  for (int32_t id : spec.special_ids) {
    if (id < 0 || id >= n)
      return invalid_argument("grammar vocab: special id " + std::to_string(id) + " out of range");
    v->kinds_[static_cast<size_t>(id)] = Kind::kExcluded;
  }
  for (int32_t id : spec.end_ids) {
    if (id < 0 || id >= n)
      return invalid_argument("grammar vocab: end id " + std::to_string(id) + " out of range");
    v->kinds_[static_cast<size_t>(id)] = Kind::kEnd;
  }
  std::sort(spec.end_ids.begin(), spec.end_ids.end());
  spec.end_ids.erase(std::unique(spec.end_ids.begin(), spec.end_ids.end()), spec.end_ids.end());
  v->end_ids_ = std::move(spec.end_ids);
  v->build_trie();
  return std::shared_ptr<const GrammarVocab>(std::move(v));
}

// Sorted by bytes, the tokens are the trie's depth-first order: each token adds the nodes past its
// longest common prefix with the previous one.
void GrammarVocab::build_trie() {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < size(); ++id) {
    if (kinds_[static_cast<size_t>(id)] == Kind::kText) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const std::string& x = token_bytes_[static_cast<size_t>(a)];
    const std::string& y = token_bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  TokenTrie& t = trie_;
  std::vector<uint32_t> open;  // node index at each depth - 1 on the current path
  const std::string* previous = nullptr;
  auto close_to = [&](size_t depth) {
    while (open.size() > depth) {
      t.subtree_ends[open.back()] = static_cast<uint32_t>(t.bytes.size());
      open.pop_back();
    }
  };
  for (int32_t id : ids) {
    const std::string& b = token_bytes_[static_cast<size_t>(id)];
    size_t lcp = 0;
    if (previous != nullptr) {
      while (lcp < b.size() && lcp < previous->size() && b[lcp] == (*previous)[lcp]) ++lcp;
    }
    close_to(lcp);
    for (size_t d = lcp; d < b.size(); ++d) {
      open.push_back(static_cast<uint32_t>(t.bytes.size()));
      t.bytes.push_back(static_cast<uint8_t>(b[d]));
      t.depths.push_back(static_cast<uint16_t>(d + 1));
      t.subtree_ends.push_back(0);
      t.token_begins.push_back(static_cast<uint32_t>(t.token_ids.size()));
    }
    t.token_ids.push_back(id);
    t.max_depth = std::max(t.max_depth, static_cast<int>(b.size()));
    previous = &b;
  }
  close_to(0);
  t.token_begins.push_back(static_cast<uint32_t>(t.token_ids.size()));
  long_token_mask_.assign(num_mask_words(), 0);
  const std::string* before = nullptr;
  for (int32_t id : ids) {
    const std::string& b = token_bytes_[static_cast<size_t>(id)];
    if (b.size() <= kShortTokenBytes) continue;
    size_t lcp = 0;
    if (before != nullptr) {
      while (lcp < b.size() && lcp < before->size() && b[lcp] == (*before)[lcp]) ++lcp;
    }
    long_tokens_.push_back(id);
    long_token_lcp_.push_back(static_cast<uint16_t>(lcp));
    long_token_mask_[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    before = &b;
  }
}

}  // namespace inferd
