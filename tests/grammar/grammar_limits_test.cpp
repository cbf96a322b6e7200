// Grammars a request can send that crashed or stalled the process before the limits and the
// linear-time passes (found by tests/fuzz/grammar_fuzzer and by hand): deep nesting is refused
// with an error naming it, and long rule chains and nested nullable repetitions compile and match.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <string_view>

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
  // Nullable links defined last-first: found nullable in one pass, not one pass per link.
  std::string text = "root ::= n0 \"z\"\n";
  for (int i = kLinks; i-- > 0;)
    text.append(cat({"n", std::to_string(i), " ::= n", std::to_string(i + 1), " | \"x\"\n"}));
  text.append(cat({"n", std::to_string(kLinks), " ::= \"\"\n"}));
  auto g = gbnf(text);
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

}  // namespace
}  // namespace inferd
