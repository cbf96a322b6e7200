// vLLM's guided_regex and guided_choice grammars.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

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

// Choices become a radix tree cut at character boundaries: a random set over an alphabet with
// multi-byte characters (shared lead bytes: é è ê) and choices that are prefixes of others,
// checked against set membership for every choice, every prefix of one, and random strings.
TEST(GrammarChoiceTest, SharedPrefixesMatchExactlyTheChoices) {
  const std::vector<std::string> alphabet = {"a", "b", "é", "è", "ê", "日", "\"", "\\", "\n"};
  std::mt19937 rng(11);
  auto word = [&](size_t max_len) {
    std::string w;
    const size_t n = rng() % (max_len + 1);
    for (size_t i = 0; i < n; ++i) w += alphabet[rng() % alphabet.size()];
    return w;
  };
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> choices;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) choices.push_back(word(6));
    if (round % 3 == 0) choices.push_back(choices[0] + choices[0]);  // one extends another
    if (round % 4 == 0) choices.push_back(choices[0]);               // a duplicate
    auto g = grammar_from_choices(choices);
    ASSERT_TRUE(g.has_value()) << g.status().message();
    std::set<std::string> members(choices.begin(), choices.end());
    std::vector<std::string> probes;
    for (const std::string& c : choices) {
      for (size_t i = 0; i <= c.size(); ++i) probes.push_back(c.substr(0, i));  // bytes, so mid-character too
      probes.push_back(c + "a");
    }
    for (int i = 0; i < 200; ++i) probes.push_back(word(8));
    for (const std::string& p : probes) {
      EXPECT_EQ(test::accepts(*g, p), members.count(p) == 1) << "round " << round << " probe '" << p << "'";
    }
  }
}

TEST(GrammarChoiceTest, ManyChoicesKeepOneParseAlive) {
  std::vector<std::string> choices;
  std::mt19937 rng(3);
  for (int i = 0; i < 50000; ++i) {
    std::string w;
    for (int j = 0; j < 10; ++j) w += static_cast<char>('a' + rng() % 26);
    choices.push_back(w);
  }
  auto g = grammar_from_choices(choices);
  ASSERT_TRUE(g.has_value()) << g.status().message();
  const auto vocab = test::byte_vocab();
  GrammarMatcher m(*g, vocab);
  std::vector<uint32_t> mask(GrammarMatcher::bitmask_words(static_cast<size_t>(vocab->size())));
  for (char c : choices[123]) {
    m.fill_next_token_bitmask(mask);
    EXPECT_TRUE(test::mask_has(mask, static_cast<uint8_t>(c)));
    ASSERT_TRUE(m.accept_bytes(std::string(1, c)));
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.failed());
}

TEST(GrammarChoiceTest, InvalidUtf8IsRefused) {
  auto g = grammar_from_choices({"ok", "bad \xC3("});
  ASSERT_FALSE(g.has_value());
  EXPECT_EQ(g.status().message(), "guided_choice: value 1 is not valid UTF-8");
}

}  // namespace
}  // namespace inferd
