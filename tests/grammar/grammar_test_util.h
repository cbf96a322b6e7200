// Helpers of the grammar tests: small vocabularies, whole-string acceptance, random walks through
// the token mask.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/grammar_vocab.h"

namespace inferd::test {

// Every single byte as tokens 0..255, then `extra` tokens, then one special and one end token.
inline std::shared_ptr<const GrammarVocab> byte_vocab(const std::vector<std::string>& extra = {}) {
  GrammarVocabSpec spec;
  for (int b = 0; b < 256; ++b) spec.token_bytes.emplace_back(1, static_cast<char>(b));
  for (const std::string& t : extra) spec.token_bytes.push_back(t);
  spec.token_bytes.push_back("<special>");
  spec.special_ids.push_back(static_cast<int32_t>(spec.token_bytes.size() - 1));
  spec.token_bytes.push_back("<eos>");
  spec.end_ids.push_back(static_cast<int32_t>(spec.token_bytes.size() - 1));
  auto v = GrammarVocab::create(std::move(spec));
  EXPECT_TRUE(v.has_value()) << v.status().message();
  return *v;
}

inline int32_t end_id(const GrammarVocab& v) {
  return v.end_ids()[0];
}

// Random multi-byte tokens drawn from `alphabet` (lengths 2..max_len), some of them pieces of
// multi-byte UTF-8 characters.
inline std::vector<std::string> random_tokens(std::mt19937& rng, int n, const std::string& alphabet,
                                              int max_len) {
  std::vector<std::string> out;
  std::uniform_int_distribution<int> len(2, max_len);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  const std::vector<std::string> utf8 = {"é",    "ü",    "€",        "日本",     "😀",
                                         "\xc3", "\xa9", "\xe2\x82", "\x82\xac", "\xf0\x9f"};
  std::uniform_int_distribution<size_t> upick(0, utf8.size() - 1);
  for (int i = 0; i < n; ++i) {
    std::string t;
    const int l = len(rng);
    for (int j = 0; j < l; ++j) {
      if (rng() % 8 == 0) {
        t += utf8[upick(rng)];
      } else {
        t += alphabet[pick(rng)];
      }
    }
    out.push_back(t);
  }
  return out;
}

inline bool mask_has(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1;
}

inline std::vector<int32_t> allowed_ids(const std::vector<uint32_t>& mask, int32_t n) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n; ++id) {
    if (mask_has(mask, id)) ids.push_back(id);
  }
  return ids;
}

// Whether `text` (bytes) is a complete sentence of `g`.
inline bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  static const auto vocab = byte_vocab();
  GrammarMatcher m(g, vocab);
  return m.accept_bytes(text) && m.can_end();
}

inline std::shared_ptr<const Grammar> gbnf(const std::string& text) {
  auto g = parse_gbnf(text);
  EXPECT_TRUE(g.has_value()) << g.status().message() << "\n" << text;
  return g.has_value() ? *g : nullptr;
}

struct WalkResult {
  std::string text;
  bool finished = false;  // ended by the end token or by termination
  int steps = 0;
};

// Samples uniformly among the allowed tokens until the end token (or termination). After
// `max_steps`, takes the end token when allowed, else single-byte tokens, often one of `closers`,
// to steer towards the end.
inline WalkResult random_walk(const std::shared_ptr<const Grammar>& g,
                              const std::shared_ptr<const GrammarVocab>& vocab, std::mt19937& rng,
                              int max_steps, const std::string& closers = "\"]}0") {
  GrammarMatcher m(g, vocab);
  WalkResult r;
  std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(vocab->size()) + 7));
  for (; r.steps < 4 * max_steps + 2000; ++r.steps) {
    if (m.is_terminated()) {
      r.finished = true;
      return r;
    }
    m.fill_next_token_bitmask(mask);
    // Padding ids past the vocabulary are never allowed.
    for (int32_t id = vocab->size(); id < static_cast<int32_t>(mask.size() * 32); ++id)
      EXPECT_FALSE(mask_has(mask, id));
    const std::vector<int32_t> ids = allowed_ids(mask, vocab->size());
    EXPECT_FALSE(ids.empty()) << "dead end after: " << r.text;
    if (ids.empty()) return r;
    int32_t pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
    if (r.steps >= max_steps) {
      if (mask_has(mask, end_id(*vocab))) {
        pick = end_id(*vocab);
      } else {
        std::vector<int32_t> singles;
        for (int32_t id : ids) {
          if (id < 256) singles.push_back(id);
        }
        if (!singles.empty())
          pick = singles[std::uniform_int_distribution<size_t>(0, singles.size() - 1)(rng)];
        // Half the time a closer (a fixed preference can loop: '0' forever in an e-mail address).
        for (char c : closers) {
          if (rng() % 2 == 0 && mask_has(mask, static_cast<unsigned char>(c))) {
            pick = static_cast<unsigned char>(c);
            break;
          }
        }
      }
    }
    EXPECT_TRUE(m.accept_token(pick)) << "a token of the mask was refused: " << pick;
    if (pick == end_id(*vocab)) {
      r.finished = true;
      return r;
    }
    r.text += vocab->token_bytes(pick);
  }
  return r;
}

}  // namespace inferd::test
