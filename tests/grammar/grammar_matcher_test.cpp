// GrammarMatcher: tokens split inside UTF-8 characters, end tokens, special and padding ids,
// termination and rollback.
#include <gtest/gtest.h>

#include <thread>

#include "grammar/grammar_cache.h"
#include "grammar_test_util.h"

namespace inferd {
namespace {

using test::allowed_ids;
using test::gbnf;
using test::mask_has;

std::vector<uint32_t> mask_of(GrammarMatcher& m, size_t num_logits) {
  std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(num_logits));
  m.fill_next_token_bitmask(mask);
  return mask;
}

TEST(GrammarMatcherTest, TokenSplitInsideUtf8Character) {
  // "é" is C3 A9, "€" is E2 82 AC: tokens that end and start inside them.
  auto vocab = test::byte_vocab({"a\xc3",
                                 "\xa9"
                                 "b",
                                 "\xe2\x82", "\xac", "\xc3\xa9"});
  const int32_t a_c3 = 256, a9_b = 257, e2_82 = 258, ac = 259, e_acute = 260;
  GrammarMatcher m(gbnf("root ::= \"a\" [é€]+ \"b\"\n"), vocab);
  auto mask = mask_of(m, static_cast<size_t>(vocab->size()));
  EXPECT_TRUE(mask_has(mask, a_c3));
  EXPECT_TRUE(mask_has(mask, 'a'));
  EXPECT_FALSE(mask_has(mask, a9_b));
  ASSERT_TRUE(m.accept_token(a_c3));  // now inside "é"
  mask = mask_of(m, static_cast<size_t>(vocab->size()));
  EXPECT_EQ(allowed_ids(mask, vocab->size()), (std::vector<int32_t>{0xA9, a9_b}));
  EXPECT_FALSE(m.accept_token(ac));
  ASSERT_TRUE(m.accept_token(0xA9));
  mask = mask_of(m, static_cast<size_t>(vocab->size()));
  EXPECT_TRUE(mask_has(mask, e2_82));
  EXPECT_TRUE(mask_has(mask, e_acute));
  EXPECT_TRUE(mask_has(mask, 0xC3));
  EXPECT_TRUE(mask_has(mask, 0xE2));
  EXPECT_TRUE(mask_has(mask, 'b'));
  EXPECT_FALSE(mask_has(mask, 0xA9));
  ASSERT_TRUE(m.accept_token(e2_82));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_token('b'));  // not between the bytes of "€"
  ASSERT_TRUE(m.accept_token(ac));
  ASSERT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.is_terminated());
}

TEST(GrammarMatcherTest, EndTokenOnlyWhereTheGrammarCanEnd) {
  auto vocab = test::byte_vocab();
  const int32_t eos = test::end_id(*vocab), special = eos - 1;
  GrammarMatcher m(gbnf("root ::= \"ab\" \"c\"*\n"), vocab);
  const size_t num_logits = static_cast<size_t>(vocab->size()) + 40;  // padded logits row
  auto mask = mask_of(m, num_logits);
  EXPECT_FALSE(mask_has(mask, eos));
  EXPECT_FALSE(mask_has(mask, special));
  EXPECT_FALSE(m.accept_token(eos));
  EXPECT_FALSE(m.accept_token(special));
  EXPECT_FALSE(m.accept_token(vocab->size() + 3));
  ASSERT_TRUE(m.accept_token('a'));
  EXPECT_FALSE(mask_has(mask_of(m, num_logits), eos));
  ASSERT_TRUE(m.accept_token('b'));
  mask = mask_of(m, num_logits);
  EXPECT_EQ(allowed_ids(mask, static_cast<int32_t>(num_logits)), (std::vector<int32_t>{'c', eos}));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.is_terminated());  // "c" may still follow
  ASSERT_TRUE(m.accept_token('c'));
  ASSERT_TRUE(m.accept_token(eos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(allowed_ids(mask_of(m, num_logits), static_cast<int32_t>(num_logits)).empty());
  EXPECT_FALSE(m.accept_token('c'));
}

TEST(GrammarMatcherTest, TerminatedWhenOnlyTheEndCanFollow) {
  auto vocab = test::byte_vocab();
  GrammarMatcher m(gbnf("root ::= \"yes\" | \"no\"\n"), vocab);
  ASSERT_TRUE(m.accept_bytes("ye"));
  EXPECT_FALSE(m.is_terminated());
  ASSERT_TRUE(m.accept_token('s'));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_EQ(allowed_ids(mask_of(m, static_cast<size_t>(vocab->size())), vocab->size()),
            (std::vector<int32_t>{test::end_id(*vocab)}));
}

TEST(GrammarMatcherTest, RejectedTokenLeavesTheStateAndRollbackUndoes) {
  auto vocab = test::byte_vocab({"ab", "abx"});
  GrammarMatcher m(gbnf("root ::= \"abc\"\n"), vocab);
  EXPECT_FALSE(m.accept_token(257));  // "abx"
  ASSERT_TRUE(m.accept_token(256));   // "ab"
  ASSERT_TRUE(m.accept_token('c'));
  EXPECT_EQ(m.num_accepted_tokens(), 2u);
  ASSERT_TRUE(m.rollback(1).is_ok());
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_token('c'));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.rollback(3).is_ok());
  ASSERT_TRUE(m.rollback(2).is_ok());
  EXPECT_TRUE(mask_has(mask_of(m, static_cast<size_t>(vocab->size())), 256));
  m.reset();
  EXPECT_EQ(m.num_accepted_tokens(), 0u);
}

TEST(GrammarMatcherTest, MatchersShareTheGrammarsContextMasks) {
  auto vocab = test::byte_vocab({"hello", "hel", "lo\"", "\"x"});
  auto g = gbnf("root ::= \"\\\"\" [a-z]* \"\\\"\" \"!\"?\n");
  GrammarMatcher a(g, vocab), b(g, vocab);
  ASSERT_TRUE(a.accept_token('"'));
  ASSERT_TRUE(b.accept_token('"'));
  const auto ma = mask_of(a, static_cast<size_t>(vocab->size()));
  const auto mb = mask_of(b, static_cast<size_t>(vocab->size()));
  EXPECT_EQ(ma, mb);
  EXPECT_TRUE(mask_has(ma, 256));
  EXPECT_TRUE(mask_has(ma, 258));   // lo" closes the string: checked against the whole stack
  EXPECT_FALSE(mask_has(ma, 259));  // "x: a quote, then a letter after the string
  EXPECT_GE(g->token_mask_cache(vocab)->num_entries(), 1u);
}

TEST(GrammarVocabTest, ChecksIdsAndBuildsTheTrieOfTextTokens) {
  EXPECT_FALSE(GrammarVocab::create({{"a", "b"}, {5}, {}}).has_value());
  EXPECT_FALSE(GrammarVocab::create({{"a", "b"}, {}, {-1}}).has_value());
  EXPECT_FALSE(GrammarVocab::create({}).has_value());
  auto v = GrammarVocab::create({{"ab", "a", "", "<s>", "ab", "b"}, {3}, {3}});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE((*v)->is_end(3));  // an end id that is also special stays an end id
  EXPECT_TRUE((*v)->is_excluded(2));
  const TokenTrie& t = (*v)->trie();
  EXPECT_EQ(t.num_nodes(), 3u);  // a, ab, b
  EXPECT_EQ(t.token_ids, (std::vector<int32_t>{1, 0, 4, 5}));
  EXPECT_EQ(t.subtree_ends, (std::vector<uint32_t>{2, 2, 3}));
}

TEST(GrammarCacheTest, SameContentSameGrammarBoundedAndThreadSafe) {
  GrammarCache cache(2);
  auto a = cache.get({GrammarKind::kJsonSchema, R"({"type": "integer"})"});
  ASSERT_TRUE(a.has_value());
  auto b = cache.get({GrammarKind::kJsonSchema, R"({"type": "integer"})"});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(cache.num_hits(), 1u);
  // Same text, other kind: another grammar.
  auto r = cache.get({GrammarKind::kRegex, R"({"type": "integer"})"});
  EXPECT_FALSE(r.has_value());  // '{' with nothing to repeat
  auto c = cache.get({GrammarKind::kChoice, R"(["x", "y"])"});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(test::accepts(*c, "y"));
  auto d = cache.get({GrammarKind::kGbnf, "root ::= \"d\"\n"});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(cache.size(), 2u);  // the integer schema went first
  auto again = cache.get({GrammarKind::kJsonSchema, R"({"type": "integer"})"});
  ASSERT_TRUE(again.has_value());
  EXPECT_NE(again->get(), a->get());
  EXPECT_EQ(cache.get({GrammarKind::kJsonSchema, "{nope"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache.get({GrammarKind::kJsonObject, ""}).has_value());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 50; ++i) {
        auto g = cache.get({GrammarKind::kRegex, "a{" + std::to_string((i + t) % 5) + "}"});
        EXPECT_TRUE(g.has_value());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(cache.size(), 2u);
}

// Matchers of one grammar on several threads share its context masks (the cache's mutex).
TEST(GrammarCacheTest, MatchersOnSeveralThreadsShareContextMasks) {
  auto vocab = test::byte_vocab({"ab", "\"a", "a\"", "\",", "12"});
  auto g =
      parse_gbnf("root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= \"\\\"\" [a-z]* \"\\\"\" | [0-9]+\n");
  ASSERT_TRUE(g.has_value());
  std::vector<std::vector<uint32_t>> masks(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      GrammarMatcher m(*g, vocab);
      EXPECT_TRUE(m.accept_bytes("[\"ab\",12,\"a"));
      masks[static_cast<size_t>(t)] = mask_of(m, static_cast<size_t>(vocab->size()));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(masks[0], masks[static_cast<size_t>(t)]);
  EXPECT_TRUE(mask_has(masks[0], 258));   // a"
  EXPECT_TRUE(mask_has(masks[0], 256));   // ab
  EXPECT_FALSE(mask_has(masks[0], 257));  // "a
}

}  // namespace
}  // namespace inferd
