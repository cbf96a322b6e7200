// vLLM's guided_regex and guided_choice grammars.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "grammar_test_util.h"

namespace inferd {
namespace {

std::shared_ptr<const Grammar> regex(const std::string& re) {
  auto g = grammar_from_regex(re);
  EXPECT_TRUE(g.has_value()) << g.status().message();
  return g.has_value() ? *g : nullptr;
}

TEST(GrammarRegexTest, WholeOutputMatches) {
  auto g = regex(R"(^\d{3}-[A-Z]{2,}(?:x|yz)?\.$)");
  EXPECT_TRUE(test::accepts(g, "123-AB."));
  EXPECT_TRUE(test::accepts(g, "123-ABCyz."));
  EXPECT_FALSE(test::accepts(g, "12-AB."));
  EXPECT_FALSE(test::accepts(g, "123-A."));
  EXPECT_FALSE(test::accepts(g, "123-ABy."));
  auto classes = regex(R"([^\s,]+,\s*\w+|[é-ë]\S\W)");
  EXPECT_TRUE(test::accepts(classes, "a-b, x_1"));
  EXPECT_TRUE(test::accepts(classes, "éa!"));
  EXPECT_FALSE(test::accepts(classes, "a b,x"));
  EXPECT_FALSE(test::accepts(classes, "éaa"));
  auto dot = regex("a.c");
  EXPECT_TRUE(test::accepts(dot, "a€c"));
  EXPECT_FALSE(test::accepts(dot, "a\nc"));
  auto named = regex(R"((?P<year>\d{4})-(?<m>\d\d)|\x41\u00e9\*\n)");
  EXPECT_TRUE(test::accepts(named, "2024-05"));
  EXPECT_TRUE(test::accepts(named, "Aé*\n"));
}

// std::regex over UTF-32, so classes and counts see code points as the grammar does.
std::wstring utf32(const std::string& s) {
  std::wstring out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int k = 1; k <= n && i + static_cast<size_t>(k) < s.size(); ++k)
      cp = (cp << 6) | (s[i + static_cast<size_t>(k)] & 0x3F);
    out += static_cast<wchar_t>(cp);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

TEST(GrammarRegexTest, RandomWalksMatchStdRegex) {
  std::mt19937 rng(5);
  auto vocab = test::byte_vocab(test::random_tokens(rng, 200, "ab01-_.@xyz", 4));
  for (const std::string re :
       {"[a-z]+@[a-z]+\\.(com|org)", "(ab|a)*b{2,3}", "-?(0|[1-9][0-9]*)(\\.[0-9]+)?", "x[^x]{0,4}y"}) {
    auto g = regex(re);
    for (int w = 0; w < 20; ++w) {
      const auto r = test::random_walk(g, vocab, rng, 40, "bym0");
      ASSERT_TRUE(r.finished) << re;
      EXPECT_TRUE(std::regex_match(utf32(r.text), std::wregex(utf32(re)))) << re << ": " << r.text;
    }
  }
}

TEST(GrammarRegexTest, UnsupportedSyntaxIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"((a)\1)", "regex: backreference is not supported at offset 3 of '(a)\\1'"},
      {R"(a(?!b))", "regex: lookaround is not supported at offset 1 of 'a(?!b)'"},
      {R"(\bword)", "regex: \\b (word boundary) is not supported at offset 0 of '\\bword'"},
      {R"(a++)", "regex: possessive quantifier is not supported at offset 2 of 'a++'"},
      {R"((?i)abc)", "regex: group flags '(?...' are not supported at offset 0 of '(?i)abc'"},
      {R"(a$b)", "regex: anchor '$' inside the pattern is not supported at offset 1 of 'a$b'"},
      {R"((ab)", "regex: unbalanced '(' at offset 0 of '(ab'"},
      {R"([[:alpha:]])", "regex: POSIX classes [:name:] are not supported at offset 1 of '[[:alpha:]]'"},
  };
  for (const auto& [re, message] : cases) {
    auto g = grammar_from_regex(re);
    ASSERT_FALSE(g.has_value()) << re;
    EXPECT_EQ(g.status().message(), message);
  }
}

TEST(GrammarChoiceTest, ExactlyOneChoice) {
  auto g = grammar_from_choices({"yes", "no", "maybe \"so\"", "日本"});
  ASSERT_TRUE(g.has_value());
  EXPECT_TRUE(test::accepts(*g, "yes"));
  EXPECT_TRUE(test::accepts(*g, "maybe \"so\""));
  EXPECT_TRUE(test::accepts(*g, "日本"));
  EXPECT_FALSE(test::accepts(*g, "ye"));
  EXPECT_FALSE(test::accepts(*g, "yesno"));
  EXPECT_FALSE(grammar_from_choices({}).has_value());
}

}  // namespace
}  // namespace inferd
