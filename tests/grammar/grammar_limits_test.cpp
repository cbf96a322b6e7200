// Grammars a request can send that crashed or stalled the process before the limits and the
// linear-time passes (found by tests/fuzz/grammar_fuzzer and by hand): deep nesting is refused
// with an error naming it, and long rule chains and nested nullable repetitions compile and match.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "grammar_test_util.h"

namespace inferd {
namespace {

using test::accepts;
using test::gbnf;

// Built with append: GCC 12 warns (-Wrestrict, wrongly) on some chains of operator+.
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

std::string nested_groups(int depth) {
  const auto n = static_cast<size_t>(depth);
  return cat({"root ::= ", std::string(n, '('), "\"a\"", std::string(n, ')'), "\n"});
}

TEST(GrammarLimitsTest, GbnfGroupsNestAtMost256Deep) {
  auto g = gbnf(nested_groups(256));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, "a"));
  for (int depth : {257, 100000}) {
    auto deep = parse_gbnf(nested_groups(depth));
    ASSERT_FALSE(deep.has_value()) << depth;
    EXPECT_EQ(deep.status().message(), "gbnf: line 1, column 266: groups nested deeper than 256");
  }
}

TEST(GrammarLimitsTest, StackedRepetitionsCountAsNesting) {
  auto g = gbnf(cat({"root ::= \"a\"", std::string(256, '?'), "\n"}));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, ""));
  for (size_t n : {257u, 100000u}) {
    auto deep = parse_gbnf(cat({"root ::= \"a\"", std::string(n, '*'), "\n"}));
    ASSERT_FALSE(deep.has_value()) << n;
    EXPECT_EQ(deep.status().message(),
              "gbnf: line 1, column 269: groups and repetitions nested deeper than 256");
  }
}

TEST(GrammarLimitsTest, RegexGroupsNestAtMost128Deep) {
  auto ok = grammar_from_regex(cat({std::string(128, '('), "ab", std::string(128, ')')}));
  ASSERT_TRUE(ok.has_value()) << ok.status().message();
  EXPECT_TRUE(accepts(*ok, "ab"));
  for (size_t n : {129u, 100000u}) {
    auto deep = grammar_from_regex(cat({std::string(n, '('), "ab", std::string(n, ')')}));
    ASSERT_FALSE(deep.has_value()) << n;
    EXPECT_NE(deep.status().message().find("regex: groups nested deeper than 128 at offset 128"),
              std::string::npos);
  }
}

TEST(GrammarLimitsTest, JsonSchemasNestAtMost64Deep) {
  auto nested_arrays = [](int levels) {  // built top-down: copying the inner schema per level is quadratic
    nlohmann::ordered_json s;
    nlohmann::ordered_json* at = &s;
    for (int i = 0; i < levels; ++i) {
      *at = {{"type", "array"}, {"items", nullptr}, {"maxItems", 1}};
      at = &(*at)["items"];
    }
    *at = {{"type", "integer"}};
    return s;
  };
  auto ok = grammar_from_json_schema(nested_arrays(63));
  ASSERT_TRUE(ok.has_value()) << ok.status().message();
  EXPECT_TRUE(accepts(*ok, cat({std::string(63, '['), "7", std::string(63, ']')})));
  for (int levels : {64, 10000}) {
    auto deep = grammar_from_json_schema(nested_arrays(levels));
    ASSERT_FALSE(deep.has_value()) << levels;
    std::string path;
    for (int i = 0; i < 64; ++i) path += "/items";
    EXPECT_EQ(deep.status().message(),
              cat({"json_schema: the schema at ", path, " is nested deeper than 64 levels"}));
  }
  // A chain of references counts too (a recursive one does not: its rule is named once).
  nlohmann::ordered_json defs = nlohmann::ordered_json::object();
  for (int i = 0; i < 200; ++i)
    defs[cat({"d", std::to_string(i)})] = {{"$ref", cat({"#/$defs/d", std::to_string(i + 1)})}};
  defs["d200"] = {{"type", "integer"}};
  auto chain = grammar_from_json_schema({{"$ref", "#/$defs/d0"}, {"$defs", defs}});
  ASSERT_FALSE(chain.has_value());
  EXPECT_NE(chain.status().message().find("is nested deeper than 64 levels"), std::string::npos);
  auto tree =
      grammar_from_json_schema({{"$ref", "#/$defs/node"},
                                {"$defs",
                                 {{"node",
                                   {{"type", "object"},
                                    {"properties",
                                     {{"v", {{"type", "integer"}}},
                                      {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                                    {"required", {"v"}}}}}}});
  ASSERT_TRUE(tree.has_value()) << tree.status().message();
  EXPECT_TRUE(accepts(*tree, R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]}]})"));
}

// A long chain of rules, left- or right-linked, in either order of definition: reading it, the
// left-recursion check and the matcher's expansion used to recurse once per link (200,000 links
// overflowed the stack) or scan the text once per reference.
TEST(GrammarLimitsTest, LongRuleChainsCompileAndMatch) {
  constexpr int kLinks = 200000;
  for (bool left : {true, false}) {
    std::string text = "root ::= r0\n";
    for (int i = 0; i < kLinks; ++i) {
      const std::string next = cat({"r", std::to_string(i + 1)});
      text.append(cat({"r", std::to_string(i), " ::= "}));
      text.append(left ? cat({next, " \"x\"\n"}) : cat({"\"x\" ", next, "\n"}));
    }
    text.append(cat({"r", std::to_string(kLinks), " ::= \"y\"\n"}));
    auto g = gbnf(text);
    ASSERT_NE(g, nullptr);
    const std::string xs(kLinks, 'x');
    const std::string fewer = xs.substr(1);
    EXPECT_TRUE(accepts(g, left ? cat({"y", xs}) : cat({xs, "y"}))) << left;
    EXPECT_FALSE(accepts(g, left ? cat({"y", fewer}) : cat({fewer, "y"}))) << left;
  }
  // Nullable links defined last-first: found nullable in one pass, not one pass per link. Each
  // link's "x" is a parse alive at the start, 200,000 of them: past the matcher's bound, so the
  // grammar is refused once those passes are done; 10,000 links compile and match.
  auto chain = [](int links) {
    std::string text = "root ::= n0 \"z\"\n";
    for (int i = links; i-- > 0;)
      text.append(cat({"n", std::to_string(i), " ::= n", std::to_string(i + 1), " | \"x\"\n"}));
    text.append(cat({"n", std::to_string(links), " ::= \"\"\n"}));
    return text;
  };
  auto refused = parse_gbnf(chain(kLinks));
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.status().message().find("too ambiguous"), std::string::npos)
      << refused.status().message();
  auto g = gbnf(chain(10000));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(accepts(g, "z"));
  EXPECT_TRUE(accepts(g, "xz"));
  EXPECT_FALSE(accepts(g, "xxz"));
}

// A repetition of a group that can match nothing in many ways (a fuzzed regex): the matcher reaches
// the same stacks along exponentially many paths, and now expands each once.
TEST(GrammarLimitsTest, NullableAlternativesUnderARepetitionExpandOnce) {
  auto g = grammar_from_regex("(||||||||||||||a-b?=){0,88}\\?$");
  ASSERT_TRUE(g.has_value()) << g.status().message();
  EXPECT_TRUE(accepts(*g, "?"));
  EXPECT_TRUE(accepts(*g, "a-b=a-=?"));
  EXPECT_FALSE(accepts(*g, "a-b"));
  auto h = gbnf("root ::= (\"\" | \"\" | \"\" | \"a\" | (\"\" | \"b\")){0,200} \"c\"\n");
  ASSERT_NE(h, nullptr);
  EXPECT_TRUE(accepts(h, "abbac"));
  const auto vocab = test::byte_vocab({"ab", "ba", "cc"});
  GrammarMatcher m(h, vocab);
  std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(vocab->size())));
  m.fill_next_token_bitmask(mask);
  EXPECT_TRUE(test::mask_has(mask, 'a'));
  EXPECT_TRUE(test::mask_has(mask, 'c'));
  EXPECT_FALSE(test::mask_has(mask, 'd'));
  EXPECT_TRUE(test::mask_has(mask, 256));  // "ab"
}

// Each "a" doubles the parses alive: after k of them a parse's stack remembers which of "c" and
// "d" each level closes with, 2^k distinct stacks. Followed without a bound, 30 bytes would hold a
// billion; the matcher stops at StackStore::kMaxStacksPerSet and says why.
TEST(GrammarLimitsTest, ExponentiallyAmbiguousGrammarFailsWithAnError) {
  auto g = gbnf("root ::= \"a\" root \"c\" | \"a\" root \"d\" | \"e\"\n");
  ASSERT_NE(g, nullptr);
  const auto vocab = test::byte_vocab();
  GrammarMatcher m(g, vocab);
  std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(vocab->size())));
  int accepted = 0;
  for (; accepted < 30; ++accepted) {
    m.fill_next_token_bitmask(mask);
    if (m.failed()) break;
    // Before the bound, the masks are the grammar's: "a" or "e" next.
    EXPECT_EQ(test::allowed_ids(mask, vocab->size()), (std::vector<int32_t>{'a', 'e'}));
    if (!m.accept_token('a')) break;
  }
  ASSERT_TRUE(m.failed());
  EXPECT_GE(accepted, 12);  // 2^13 < kMaxStacksPerSet
  EXPECT_LE(accepted, 16);
  EXPECT_NE(m.error().find("the output grammar is too ambiguous: more than 16384 parses"), std::string::npos)
      << m.error();
  // Failed for good: no token allowed, none accepted, not complete.
  m.fill_next_token_bitmask(mask);
  EXPECT_TRUE(test::allowed_ids(mask, vocab->size()).empty());
  EXPECT_FALSE(m.accept_token('a'));
  EXPECT_FALSE(m.accept_token('e'));
  EXPECT_FALSE(m.can_end());
  // Another matcher of the same grammar (sharing its token mask cache) starts clean and, on an
  // input that stays small, completes.
  GrammarMatcher other(g, vocab);
  ASSERT_TRUE(other.accept_bytes("aae"));
  other.fill_next_token_bitmask(mask);
  EXPECT_FALSE(other.failed());
  EXPECT_EQ(test::allowed_ids(mask, vocab->size()), (std::vector<int32_t>{'c', 'd'}));
  EXPECT_TRUE(test::accepts(g, "aaedc"));
}

// A grammar that starts with more parses alive than the bound is refused when compiled (on the
// server's input worker: a 400), not on the request's first token.
TEST(GrammarLimitsTest, TooManyParsesAtTheStartIsACompileError) {
  std::string text = "root ::= ";
  for (int i = 0; i < 20000; ++i) {
    if (i > 0) text += " | ";
    text += cat({"\"x", std::to_string(i), "\""});
  }
  auto g = parse_gbnf(text + "\n");
  ASSERT_FALSE(g.has_value());
  EXPECT_NE(g.status().message().find("too ambiguous"), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("at its start"), std::string::npos) << g.status().message();
}

// Within the bound on live parses, the time of one token is bounded too: N alternatives of
// `w "<i>"` with `w ::= [a-z]{0,500}` keep N parses alive (each waits for its own suffix), each
// byte of a token making a new state, so a token of 400 letters costs about N x 400 x a few units
// of StackStore::work(). 1,000 alternatives stay under kMaxWorkPerToken; 7,000 (14,000 live parses
// at the start, under kMaxStacksPerSet) pass it, and fail with the error.
TEST(GrammarLimitsTest, OneTokensParserWorkIsBounded) {
  const auto vocab = test::byte_vocab({std::string(400, 'a')});
  const int32_t long_token = 256;
  for (int alternatives : {1000, 7000}) {
    std::string text = "w ::= [a-z]{0,500}\nroot ::= ";
    for (int i = 0; i < alternatives; ++i) {
      if (i > 0) text += " | ";
      text += cat({"w \"<", std::to_string(i), ">\""});
    }
    auto g = gbnf(text + "\n");
    ASSERT_NE(g, nullptr);
    GrammarMatcher m(g, vocab);
    std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(vocab->size())));
    m.fill_next_token_bitmask(mask);
    const bool accepted = !m.failed() && m.accept_token(long_token);
    if (alternatives == 1000) {
      EXPECT_TRUE(accepted);
      EXPECT_FALSE(m.failed());
      EXPECT_GT(m.token_work(), 400u * 1000u);
      EXPECT_LT(m.token_work(), StackStore::kMaxWorkPerToken);
      EXPECT_TRUE(m.accept_bytes("<7>"));
      EXPECT_TRUE(m.can_end());
    } else {
      EXPECT_FALSE(accepted);
      ASSERT_TRUE(m.failed());
      EXPECT_NE(m.error().find("parser steps for one token"), std::string::npos) << m.error();
    }
  }
}

}  // namespace
}  // namespace inferd
