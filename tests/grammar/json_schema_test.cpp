// JSON schema -> grammar: a corpus of schemas whose random walks through the token mask always
// give a document that parses and validates; unsupported keywords are errors naming them.
#include <gtest/gtest.h>

#include <random>

#include "grammar_test_util.h"
#include "json_schema_validator.h"
#include "schema_corpus.h"

namespace inferd {
namespace {

using Json = nlohmann::ordered_json;
using test::schema_corpus;

std::shared_ptr<const Grammar> compile(const std::string& schema_text) {
  auto g = grammar_from_json_schema(Json::parse(schema_text));
  EXPECT_TRUE(g.has_value()) << g.status().message() << "\n" << schema_text;
  return g.has_value() ? *g : nullptr;
}

void walk_and_validate(const std::string& schema_text, const std::shared_ptr<const GrammarVocab>& vocab,
                       std::mt19937& rng, int walks, int max_steps) {
  const Json schema = Json::parse(schema_text);
  auto g = compile(schema_text);
  ASSERT_NE(g, nullptr);
  test::JsonSchemaValidator validator(schema);
  for (int w = 0; w < walks; ++w) {
    const test::WalkResult r = test::random_walk(g, vocab, rng, max_steps);
    ASSERT_TRUE(r.finished) << schema_text << "\nunfinished: " << r.text;
    Json doc;
    try {
      doc = Json::parse(r.text);
    } catch (const std::exception& e) {
      FAIL() << schema_text << "\ndoes not parse (" << e.what() << "): " << r.text;
    }
    const std::string why = validator.check(doc);
    ASSERT_TRUE(why.empty()) << schema_text << "\ninvalid (" << why << "): " << r.text;
  }
}

TEST(GrammarJsonSchemaTest, CorpusHasEnoughSchemas) {
  EXPECT_GE(schema_corpus().size(), 30u);
}

TEST(GrammarJsonSchemaTest, RandomWalksWithMultiByteTokensValidate) {
  std::mt19937 rng(7);
  auto vocab = test::byte_vocab(test::random_tokens(rng, 400, "{}[]\",:  abcAZ019.-+eE@Tnulltruefalse\\", 6));
  for (const std::string& s : schema_corpus()) walk_and_validate(s, vocab, rng, 20, 150);
}

TEST(GrammarJsonSchemaTest, RandomWalksWithSingleByteTokensValidate) {
  std::mt19937 rng(8);
  auto vocab = test::byte_vocab();
  for (const std::string& s : schema_corpus()) walk_and_validate(s, vocab, rng, 20, 300);
}

TEST(GrammarJsonSchemaTest, AnyJsonGrammarIsAnyObject) {
  std::mt19937 rng(9);
  auto vocab = test::byte_vocab(test::random_tokens(rng, 200, "{}[]\",: ab1.-", 4));
  for (int w = 0; w < 20; ++w) {
    const test::WalkResult r = test::random_walk(any_json_grammar(), vocab, rng, 200);
    ASSERT_TRUE(r.finished);
    Json doc;
    ASSERT_NO_THROW(doc = Json::parse(r.text)) << r.text;
    EXPECT_TRUE(doc.is_object()) << r.text;
  }
  EXPECT_TRUE(test::accepts(any_json_grammar(), R"({"a": [1, {"b": null}], "c": "\u00e9\ud83d\ude00"})"));
  EXPECT_FALSE(test::accepts(any_json_grammar(), R"([1])"));
  EXPECT_FALSE(test::accepts(any_json_grammar(), R"({"a": "\ud83d"})"));  // a lone surrogate
  EXPECT_FALSE(test::accepts(any_json_grammar(), R"({"a":  1})"));        // one space at most
}

TEST(GrammarJsonSchemaTest, PropertiesInSchemaOrderAndRequiredOnes) {
  auto g = compile(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["b"]})");
  EXPECT_TRUE(test::accepts(g, R"({"b":1})"));
  EXPECT_TRUE(test::accepts(g, R"({"a":1, "b":2,"c":3})"));
  EXPECT_TRUE(test::accepts(g, R"({"b":2,"c":3})"));
  EXPECT_FALSE(test::accepts(g, R"({"a":1})"));
  EXPECT_FALSE(test::accepts(g, R"({"b":2,"a":1})"));
  EXPECT_FALSE(test::accepts(g, R"({"b":1,"d":2})"));  // additionalProperties absent: none
  auto open = compile(
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true})");
  EXPECT_TRUE(test::accepts(open, R"({"a":1,"zz":[true]})"));
  EXPECT_TRUE(test::accepts(open, R"({"ab":1})"));
  EXPECT_FALSE(test::accepts(open, R"({"a":1,"a":2})"));  // a declared key is not an extra one
}

// vLLM's layout options: no whitespace at all, a whitespace pattern at every structural
// position (outlines'), additionalProperties absent meaning any other keys. The defaults give
// the same grammar as before; random walks in every layout still validate.
TEST(GrammarJsonSchemaTest, LayoutOptions) {
  const Json schema = Json::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}},
          "required": ["a", "b"]})");
  JsonGrammarOptions none;
  none.whitespace = JsonGrammarOptions::Whitespace::kNone;
  JsonGrammarOptions pattern;
  pattern.whitespace = JsonGrammarOptions::Whitespace::kPattern;
  pattern.whitespace_pattern = "[\\n ]{0,4}";
  JsonGrammarOptions open;
  open.additional_properties_by_default = true;
  EXPECT_EQ(*json_schema_to_gbnf(schema, JsonGrammarOptions{}), *json_schema_to_gbnf(schema));
  EXPECT_EQ(JsonGrammarOptions{}.key(), "");
  EXPECT_NE(none.key(), pattern.key());
  auto get = [&](const JsonGrammarOptions& o) {
    auto g = grammar_from_json_schema(schema, o);
    EXPECT_TRUE(g.has_value()) << g.status().message();
    return g.has_value() ? *g : nullptr;
  };
  const auto g_none = get(none), g_pattern = get(pattern), g_open = get(open), g_default = get({});
  EXPECT_TRUE(test::accepts(g_none, R"({"a":1,"b":[1,2]})"));
  EXPECT_FALSE(test::accepts(g_none, R"({"a": 1,"b":[1,2]})"));
  EXPECT_TRUE(test::accepts(g_default, R"({"a": 1, "b": [1, 2]})"));
  EXPECT_FALSE(test::accepts(g_default, "{\n \"a\": 1, \"b\": [1, 2]}"));
  EXPECT_TRUE(test::accepts(g_pattern, "{\n  \"a\" : 1,\n  \"b\": [ 1 ,2 ]\n}"));
  EXPECT_TRUE(test::accepts(g_pattern, R"({"a":1,"b":[]})"));
  EXPECT_TRUE(test::accepts(g_pattern, "{\"a\":1,\"b\":[  ]}"));
  EXPECT_FALSE(test::accepts(g_pattern, "{\"a\":1,\"b\":[1]     }"));  // five: over {0,4}
  EXPECT_FALSE(test::accepts(g_pattern, "{\"a\":1,\t\"b\":[1]}"));     // a tab is not in the pattern
  EXPECT_TRUE(test::accepts(g_open, R"({"a":1,"b":[],"c":{"d":null}})"));
  EXPECT_FALSE(test::accepts(g_default, R"({"a":1,"b":[],"c":2})"));
  // json_object in a layout.
  auto any_none = any_json_grammar(none), any_pattern = any_json_grammar(pattern);
  ASSERT_TRUE(any_none.has_value() && any_pattern.has_value());
  EXPECT_TRUE(test::accepts(*any_none, R"({"x":[1,{"y":2}]})"));
  EXPECT_FALSE(test::accepts(*any_none, R"({"x": 1})"));
  EXPECT_TRUE(test::accepts(*any_pattern, "{ \"x\" : [ 1 , { } ] }"));
  EXPECT_EQ(any_json_grammar(JsonGrammarOptions{}).value(), any_json_grammar());
  // A pattern that does not compile names the option.
  JsonGrammarOptions broken = pattern;
  broken.whitespace_pattern = "[ ";
  EXPECT_NE(json_schema_to_gbnf(schema, broken).status().message().find("whitespace_pattern"),
            std::string::npos);
  // Random walks in each layout give documents that parse and validate.
  std::mt19937 rng(11);
  auto vocab =
      test::byte_vocab(test::random_tokens(rng, 300, "{}[]\",: \nabcAZ019.-+eE@Tnulltruefalse\\", 5));
  for (const JsonGrammarOptions& o : {none, pattern, open}) {
    for (const std::string& s : schema_corpus()) {
      const Json schema_json = Json::parse(s);  // the validator keeps a reference
      auto g = grammar_from_json_schema(schema_json, o);
      ASSERT_TRUE(g.has_value()) << g.status().message() << "\n" << s;
      test::JsonSchemaValidator validator(schema_json);
      for (int w = 0; w < 5; ++w) {
        const test::WalkResult r = test::random_walk(*g, vocab, rng, 200);
        ASSERT_TRUE(r.finished) << s << "\nunfinished: " << r.text;
        Json doc;
        ASSERT_NO_THROW(doc = Json::parse(r.text)) << r.text;
        if (!o.additional_properties_by_default) {
          EXPECT_EQ(validator.check(doc), "") << s << "\n" << r.text;
        }
      }
    }
  }
}

TEST(GrammarJsonSchemaTest, IntegerBoundsAreExact) {
  auto g = compile(R"({"type": "integer", "minimum": -12, "maximum": 305})");
  for (int v = -200; v <= 1000; ++v)
    EXPECT_EQ(test::accepts(g, std::to_string(v)), v >= -12 && v <= 305) << v;
  EXPECT_FALSE(test::accepts(g, "007"));
  EXPECT_FALSE(test::accepts(g, "-0"));
  auto ex = compile(R"({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 9})");
  for (int v = 0; v <= 20; ++v) EXPECT_EQ(test::accepts(ex, std::to_string(v)), v > 5 && v < 9) << v;
}

TEST(GrammarJsonSchemaTest, UnsupportedKeywordsAreErrorsNamingThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"x": {}}}}})",
       "json_schema: keyword 'patternProperties' at /properties/a is not supported"},
      {R"({"type": "object", "minProperties": 1})",
       "json_schema: keyword 'minProperties' at / is not supported"},
      {R"({"type": "array", "items": {"type": "integer", "multipleOf": 3}})",
       "json_schema: keyword 'multipleOf' at /items is not supported"},
      {R"({"type": "array", "uniqueItems": true})",
       "json_schema: keyword 'uniqueItems' at / is not supported"},
      {R"({"not": {"type": "string"}})", "json_schema: keyword 'not' at / is not supported"},
      {R"({"if": {}, "then": {}})", "json_schema: keyword 'if' at / is not supported"},
      {R"({"type": "array", "contains": {}})", "json_schema: keyword 'contains' at / is not supported"},
      {R"({"type": "object", "propertyNames": {"maxLength": 3}})",
       "json_schema: keyword 'propertyNames' at / is not supported"},
      {R"({"type": "object", "dependentRequired": {}})",
       "json_schema: keyword 'dependentRequired' at / is not supported"},
      {R"({"allOf": [{"type": "object"}, {"required": ["a"]}]})",
       "json_schema: keyword 'allOf' at / with 2 schemas is not supported (one only)"},
      {R"({"type": "string", "format": "hostname"})", "json_schema: format 'hostname' at / is not supported"},
      {R"({"$ref": "https://example.com/s.json"})",
       "json_schema: keyword '$ref' at / 'https://example.com/s.json' is not supported (only references "
       "inside the schema, '#...')"},
      {R"({"anyOf": [{"type": "string"}], "minLength": 2})",
       "json_schema: keyword 'minLength' at / alongside 'anyOf' is not supported"},
      {R"({"type": "string", "pattern": "(?=a)b"})",
       "json_schema: pattern at /: regex: lookaround is not supported at offset 0 of '(?=a)b'"},
  };
  for (const auto& [schema, message] : cases) {
    auto g = grammar_from_json_schema(Json::parse(schema));
    ASSERT_FALSE(g.has_value()) << schema;
    EXPECT_EQ(g.status().message(), message);
  }
}

TEST(GrammarJsonSchemaTest, GbnfTextIsReadable) {
  auto text = json_schema_to_gbnf(
      Json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})"));
  ASSERT_TRUE(text.has_value());
  EXPECT_NE(text->find("root ::= "), std::string::npos);
  EXPECT_NE(text->find("json-integer ::= "), std::string::npos);
  EXPECT_TRUE(parse_gbnf(*text).has_value());
}

// Enums share their values' prefixes (gbnf_alternatives_tree): mixed values with shared prefixes
// and multi-byte characters match exactly their members, and an enum of 50,000 strings (50,000
// parses alive at the start, past the matcher's bound, when written one alternative per value)
// compiles and matches.
TEST(GrammarJsonSchemaTest, EnumsMatchExactlyTheirMembers) {
  const Json values = Json::parse(R"(["red", "reddish", "rouge", "rôle", "rôti", 1, 10, 1.5, null, true,
                                      {"a": [1, 2]}, [], "", "日本", "日本語"])");
  auto g = compile(Json{{"enum", values}}.dump());
  ASSERT_NE(g, nullptr);
  for (const Json& v : values) EXPECT_TRUE(test::accepts(g, v.dump())) << v.dump();
  for (const char* not_member : {"\"re\"", "\"redd\"", "\"rô\"", "100", "1.", "\"日\"", "false", "{}", "[1]"})
    EXPECT_FALSE(test::accepts(g, not_member)) << not_member;
  Json many = Json::array();
  for (int i = 0; i < 50000; ++i) many.push_back("value-" + std::to_string(i * 7919));
  auto big = compile(Json{{"enum", many}}.dump());
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(test::accepts(big, "\"value-7919\""));
  EXPECT_TRUE(test::accepts(big, many[49999].dump()));
  EXPECT_FALSE(test::accepts(big, "\"value-7\""));
}

}  // namespace
}  // namespace inferd
