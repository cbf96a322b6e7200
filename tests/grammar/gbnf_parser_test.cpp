// GBNF reading: syntax, errors with line and column, and the language each construct accepts.
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace inferd {
namespace {

using test::accepts;
using test::gbnf;

std::string parse_error(const std::string& text) {
  auto g = parse_gbnf(text);
  EXPECT_FALSE(g.has_value()) << text;
  return g.has_value() ? "" : g.status().message();
}

TEST(GrammarGbnfTest, ErrorsNameLineAndColumn) {
  EXPECT_EQ(parse_error("root ::= \"a\"\nfoo := \"b\"\n"),
            "gbnf: line 2, column 5: expected '::=' after rule name 'foo'");
  EXPECT_EQ(parse_error("root ::= \"abc\n"), "gbnf: line 1, column 10: unterminated string literal");
  EXPECT_EQ(parse_error("root ::= [a-z\n"), "gbnf: line 1, column 10: unterminated character class");
  EXPECT_EQ(parse_error("root ::= ( \"a\" \n"), "gbnf: line 2, column 1: expected ')'");
  EXPECT_EQ(parse_error("root ::= \"a\" other\n"), "gbnf: line 1, column 14: undefined rule 'other'");
  EXPECT_EQ(parse_error("a ::= \"x\"\n"), "gbnf: the grammar has no 'root' rule");
  EXPECT_EQ(parse_error("root ::= \"a\"\nroot ::= \"b\"\n"),
            "gbnf: line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(parse_error("root ::= \"\\q\"\n"), "gbnf: line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(parse_error("root ::= \"a\"{3,2}\n"),
            "gbnf: line 1, column 16: repetition maximum below its minimum");
  EXPECT_EQ(parse_error("root ::= * \"a\"\n"),
            "gbnf: line 1, column 10: '*' with nothing before it to repeat");
  EXPECT_EQ(parse_error("root ::= [z-a]\n"), "gbnf: line 1, column 12: character range out of order");
  EXPECT_NE(parse_error("root ::= root \"a\" | \"b\"\n").find("left recursion through rule 'root'"),
            std::string::npos);
  EXPECT_NE(parse_error("root ::= (\"a\"?)*\n").find("left recursion"), std::string::npos);
}

TEST(GrammarGbnfTest, LiteralsAndEscapes) {
  auto g = gbnf("root ::= \"a\\n\\t\\r\\\\\\\"\\x41\\u00e9\\U0001F600\"\n");
  EXPECT_TRUE(accepts(g, "a\n\t\r\\\"Aé😀"));
  EXPECT_FALSE(accepts(g, "a\n\t\r\\\"Aé"));
  EXPECT_FALSE(accepts(g, "a\n\t\r\\\"Ae😀"));
  EXPECT_TRUE(accepts(gbnf("root ::= \"日本\"\n"), "日本"));
}

TEST(GrammarGbnfTest, ClassesDotAndNegation) {
  auto g = gbnf("root ::= [a-cx] [^a-z] .\n");
  EXPECT_TRUE(accepts(g, "a1z"));
  EXPECT_TRUE(accepts(g, "xé😀"));
  EXPECT_FALSE(accepts(g, "d1z"));
  EXPECT_FALSE(accepts(g, "aaz"));
  EXPECT_FALSE(accepts(g, "a1"));
  EXPECT_FALSE(accepts(g, "a1\xff"));          // not UTF-8
  EXPECT_FALSE(accepts(g, "a1\xed\xa0\x80"));  // a surrogate's encoding is not UTF-8
  auto cjk = gbnf("root ::= [一-龥]+\n");
  EXPECT_TRUE(accepts(cjk, "日本語"));
  EXPECT_FALSE(accepts(cjk, "日本a"));
  auto esc = gbnf("root ::= [\\]\\-\\\\]+\n");
  EXPECT_TRUE(accepts(esc, "]-\\"));
  EXPECT_FALSE(accepts(esc, "a"));
}

TEST(GrammarGbnfTest, Repetitions) {
  auto g = gbnf("root ::= \"a\"* \"b\"+ \"c\"? \"d\"{2} \"e\"{1,} \"f\"{0,2}\n");
  EXPECT_TRUE(accepts(g, "bdde"));
  EXPECT_TRUE(accepts(g, "aaabbcddeeeff"));
  EXPECT_FALSE(accepts(g, "dde"));      // b+ needs one
  EXPECT_FALSE(accepts(g, "bde"));      // d{2}
  EXPECT_FALSE(accepts(g, "bddefff"));  // f{0,2}
  EXPECT_FALSE(accepts(g, "bccdde"));   // c?
  auto group = gbnf("root ::= (\"ab\" | \"c\"){2,3}\n");
  EXPECT_TRUE(accepts(group, "abc"));
  EXPECT_TRUE(accepts(group, "cabab"));
  EXPECT_FALSE(accepts(group, "c"));
  EXPECT_FALSE(accepts(group, "cccc"));
}

TEST(GrammarGbnfTest, CommentsMultiLineRulesAndRecursion) {
  auto g = gbnf(
      "# balanced parentheses\n"
      "root ::= item+   # one or more\n"
      "item ::= \"(\" (\n"
      "    item\n"
      "  )* \")\"\n"
      "  | \"x\"\n");
  EXPECT_TRUE(accepts(g, "x"));
  EXPECT_TRUE(accepts(g, "(()(x))x"));
  EXPECT_FALSE(accepts(g, "(()"));
  EXPECT_FALSE(accepts(g, "())"));
}

TEST(GrammarGbnfTest, LlamaCppJsonGrammar) {
  // grammars/json.gbnf of llama.cpp.
  auto g = gbnf(R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)");
  EXPECT_TRUE(accepts(g, R"({"a": [1, 2.5, "x\n", {"b": null}], "c": true})"));
  EXPECT_FALSE(accepts(g, R"({"a": })"));
  EXPECT_FALSE(accepts(g, R"([1])"));
}

}  // namespace
}  // namespace inferd
