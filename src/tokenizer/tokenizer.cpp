#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace inferd {

namespace {
constexpr size_t kMaxCacheEntries = 1 << 16;
uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

Tokenizer::Tokenizer(Vocab vocab, PreTokenizer pre) : vocab_(std::move(vocab)), pre_(std::move(pre)) {}

Expected<std::unique_ptr<Tokenizer>> Tokenizer::create(Vocab vocab) {
  INFERD_ASSIGN_OR_RETURN(PreTokenizer pre, PreTokenizer::create(vocab.pre_tokenizer_patterns));
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab), std::move(pre)));
  INFERD_RETURN_IF_ERROR(t->build());
  return t;
}

Status Tokenizer::build() {
  const size_t n = vocab_.tokens.size();
  if (n == 0) return invalid_argument("the vocabulary is empty");
  token_to_id_.reserve(n);
  token_bytes_.resize(n);
  is_special_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    token_to_id_.emplace(vocab_.tokens[i], static_cast<int32_t>(i));
    if (!byte_level_decode(vocab_.tokens[i], &token_bytes_[i])) token_bytes_[i] = vocab_.tokens[i];
  }
  added_by_first_byte_.assign(256, {});
  for (const AddedToken& a : vocab_.added_tokens) {
    token_bytes_[static_cast<size_t>(a.id)] = a.content;
    token_to_id_[vocab_.tokens[static_cast<size_t>(a.id)]] = a.id;
    if (a.special) is_special_[static_cast<size_t>(a.id)] = 1;
    added_by_first_byte_[static_cast<uint8_t>(a.content[0])].push_back(&a);
  }
  for (auto& list : added_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* x, const AddedToken* y) {
      return x->content.size() > y->content.size();
    });
  }
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id_.find(byte_to_unicode(static_cast<uint8_t>(b)));
    if (it != token_to_id_.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  merges_.reserve(vocab_.merges.size());
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const auto& [left, right] = vocab_.merges[r];
    auto l = token_to_id_.find(left), rt = token_to_id_.find(right), m = token_to_id_.find(left + right);
    if (l == token_to_id_.end() || rt == token_to_id_.end() || m == token_to_id_.end()) continue;
    merges_.emplace(pair_key(l->second, rt->second), Merge{static_cast<int32_t>(r), m->second});
  }
  return Status::ok();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode_impl(text, allow_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text,
                                       std::span<const std::pair<size_t, size_t>> plain_ranges) const {
  return encode_impl(text, true, plain_ranges);
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool allow_special,
                                            std::span<const std::pair<size_t, size_t>> plain_ranges) const {
  std::vector<int32_t> out;
  // Ranges refer to the caller's bytes: they stay valid only if sanitizing changes nothing.
  const bool valid = is_valid_utf8(text);
  if (!valid && !plain_ranges.empty()) allow_special = false;  // ranges unusable: allow none
  if (!valid) plain_ranges = {};
  const std::string clean = valid ? std::string(text) : sanitize_utf8(text);
  size_t next_range = 0;
  auto overlaps_plain = [&](size_t begin, size_t end) {
    while (next_range < plain_ranges.size() && plain_ranges[next_range].second <= begin) ++next_range;
    return next_range < plain_ranges.size() && plain_ranges[next_range].first < end;
  };
  const std::string_view s(clean);
  size_t segment_start = 0;
  size_t i = 0;
  while (i < s.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* a : added_by_first_byte_[static_cast<uint8_t>(s[i])]) {
      if ((allow_special || !a->special) && s.compare(i, a->content.size(), a->content) == 0 &&
          !(a->special && overlaps_plain(i, i + a->content.size()))) {
        hit = a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > segment_start) encode_text(s.substr(segment_start, i - segment_start), &out);
    out.push_back(hit->id);
    i += hit->content.size();
    segment_start = i;
  }
  if (segment_start < s.size()) encode_text(s.substr(segment_start), &out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  if (vocab_.add_bos && vocab_.bos_id) ids.push_back(*vocab_.bos_id);
  auto body = encode(text, allow_special);
  ids.insert(ids.end(), body.begin(), body.end());
  if (vocab_.append_id) ids.push_back(*vocab_.append_id);
  return ids;
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>* out) const {
  std::string normalized;
  if (vocab_.nfc) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::vector<std::string_view> pieces;
  std::lock_guard<std::mutex> lock(mutex_);
  pre_.split(text, &pieces);
  for (std::string_view p : pieces) encode_piece(p, out);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  auto it = cache_.find(std::string(piece));
  if (it != cache_.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> ids;
  bpe(piece, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::string(piece), std::move(ids));
}

// Standard BPE: repeatedly merge the adjacent pair of lowest rank (leftmost on ties).
void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  if (vocab_.ignore_merges) {
    auto whole = token_to_id_.find(byte_level_encode(piece));
    if (whole != token_to_id_.end()) {
      out->push_back(whole->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // a byte the vocabulary cannot express is dropped, as tokenizers does
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back({id, idx - 1, idx + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Candidate {
    int32_t rank, left;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[static_cast<size_t>(left)].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(sym[static_cast<size_t>(left)].id, sym[static_cast<size_t>(right)].id));
    if (it != merges_.end())
      queue.push(
          {it->second.rank, left, sym[static_cast<size_t>(left)].id, sym[static_cast<size_t>(right)].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(c.left)];
    if (l.id != c.left_id || l.next < 0 || sym[static_cast<size_t>(l.next)].id != c.right_id)
      continue;  // stale
    Symbol& r = sym[static_cast<size_t>(l.next)];
    l.id = merges_.at(pair_key(c.left_id, c.right_id)).merged_id;
    r.id = -1;  // dead
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    push(l.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next)
    out->push_back(sym[static_cast<size_t>(i)].id);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

}  // namespace inferd
