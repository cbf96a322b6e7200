// The scalar half of JsonSchemaCompiler: the JSON primitives, strings (lengths, pattern, format),
// integers and numbers with bounds, and keys outside a set; and the public entry points.
#include <cmath>
#include <limits>
#include <map>

#include "common/check.h"

#include "grammar/grammar.h"
#include "grammar/json_number_ranges.h"
#include "grammar/json_schema_compiler.h"

namespace inferd {

namespace {

// The JSON primitives. Whitespace: an optional single space after ':' and ',' only (docs/grammar.md).
// Strings: any character but '"', '\' and controls, or an escape; a \u escape is a scalar value or
// a surrogate pair (what JSON parsers accept). Integers: at most 16 digits (exact in an int64 and a
// double); exponents at most 2 digits.
const std::map<std::string, std::string>& primitive_bodies() {
  static const std::map<std::string, std::string> p = {
      // ws, json-object, json-member and json-array depend on the layout: primitive_body().
      {"ws", ""},
      {"json-value", "json-object | json-array | json-string | json-number | json-boolean | json-null"},
      {"json-object", ""},
      {"json-member", ""},
      {"json-array", ""},
      {"json-string", "\"\\\"\" json-char* \"\\\"\""},
      {"json-char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" json-u-escape )"},
      {"json-u-escape",
       "[0-9a-cA-Ce-fE-F] json-hex json-hex json-hex | [dD] [0-7] json-hex json-hex | "
       "[dD] [89abAB] json-hex json-hex \"\\\\u\" [dD] [c-fC-F] json-hex json-hex"},
      {"json-hex", "[0-9a-fA-F]"},
      {"json-key-char", "[^\"\\\\\\x00-\\x1F]"},
      {"json-int-part", "\"0\" | [1-9] [0-9]{0,15}"},
      {"json-integer", "\"-\"? json-int-part"},
      {"json-fraction", "\".\" [0-9]+"},
      {"json-number", "\"-\"? json-int-part json-fraction? ( [eE] [-+]? [0-9]{1,2} )?"},
      {"json-boolean", "\"true\" | \"false\""},
      {"json-null", "\"null\""},
  };
  return p;
}

const std::map<std::string, std::string>& formats() {
  static const std::map<std::string, std::string> f = {
      {"date",
       "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )"},
      {"time",
       "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
       "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
      {"uuid",
       "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
      {"email",
       "[a-zA-Z0-9_%+-]+ ( \".\" [a-zA-Z0-9_%+-]+ )* \"@\" [a-zA-Z0-9] [a-zA-Z0-9-]* "
       "( \".\" [a-zA-Z0-9] [a-zA-Z0-9-]* )+"},
  };
  return f;
}

}  // namespace

std::string JsonSchemaCompiler::primitive_body(const std::string& name) const {
  using W = JsonGrammarOptions::Whitespace;
  if (name == "ws") return options_.whitespace == W::kPattern ? ws_expr_ : "\" \"?";
  // Built from the same pieces as object_expr / array_expr (colon(), comma(), ...) but as text:
  // these are const and the pieces add the ws rule, which primitive() adds as a dependency.
  const bool pattern = options_.whitespace == W::kPattern;
  const std::string ws_after = options_.whitespace == W::kNone ? "" : " ws";
  const std::string sep = (pattern ? "ws " : "") + std::string("\",\"") + ws_after;
  const std::string colon = (pattern ? "ws " : "") + std::string("\":\"") + ws_after;
  const std::string lead = pattern ? " ws" : "", trail = pattern ? "ws " : "";
  if (name == "json-object")
    return "\"{\"" + lead + " ( json-member ( " + sep + " json-member )* " + trail + ")? \"}\"";
  if (name == "json-member") return "json-string " + colon + " json-value";
  if (name == "json-array")
    return "\"[\"" + lead + " ( json-value ( " + sep + " json-value )* " + trail + ")? \"]\"";
  return primitive_bodies().at(name);
}

std::string JsonSchemaCompiler::colon() {
  using W = JsonGrammarOptions::Whitespace;
  if (options_.whitespace == W::kNone) return "\":\"";
  const std::string ws = primitive("ws");
  return options_.whitespace == W::kPattern ? ws + " \":\" " + ws : "\":\" " + ws;
}

std::string JsonSchemaCompiler::comma() {
  using W = JsonGrammarOptions::Whitespace;
  if (options_.whitespace == W::kNone) return "\",\"";
  const std::string ws = primitive("ws");
  return options_.whitespace == W::kPattern ? ws + " \",\" " + ws : "\",\" " + ws;
}

std::string JsonSchemaCompiler::open(char c) {
  const std::string literal = std::string("\"") + c + "\"";
  return options_.whitespace == JsonGrammarOptions::Whitespace::kPattern ? literal + " " + primitive("ws")
                                                                         : literal;
}

std::string JsonSchemaCompiler::close(char c) {
  const std::string literal = std::string("\"") + c + "\"";
  return options_.whitespace == JsonGrammarOptions::Whitespace::kPattern ? primitive("ws") + " " + literal
                                                                         : literal;
}

Status JsonSchemaCompiler::check_options() {
  if (options_.whitespace != JsonGrammarOptions::Whitespace::kPattern) return Status::ok();
  if (options_.whitespace_pattern.empty()) return invalid_argument("whitespace_pattern: must not be empty");
  auto expr = regex_to_gbnf(options_.whitespace_pattern, /*in_json_string=*/false);
  if (!expr) return expr.status().with_context("whitespace_pattern");
  ws_expr_ = "( " + *expr + " )";
  return Status::ok();
}

std::string JsonSchemaCompiler::primitive(const std::string& name) {
  if (names_.contains(name)) return name;
  names_.insert(name);
  const std::string body = primitive_body(name);
  rules_.emplace_back(name, body);
  // Its dependencies (names in the body that are primitives).
  for (const auto& [dep, unused] : primitive_bodies()) {
    size_t at = 0;
    while ((at = body.find(dep, at)) != std::string::npos) {
      const size_t end = at + dep.size();
      const bool whole =
          (at == 0 || body[at - 1] == ' ') && (end == body.size() || body[end] == ' ' || body[end] == '*' ||
                                               body[end] == '?' || body[end] == '+');
      if (whole) primitive(dep);
      at = end;
    }
  }
  return name;
}

Expected<std::string> JsonSchemaCompiler::string_expr(const Json& schema, const std::string& path) {
  const std::string quote = "\"\\\"\"";
  if (schema.contains("format")) {
    if (!schema["format"].is_string()) return keyword_error("format", path, "must be a string");
    const std::string f = schema["format"].get<std::string>();
    for (const char* other : {"pattern", "minLength", "maxLength"}) {
      if (schema.contains(other)) return keyword_error(other, path, "alongside 'format' is not supported");
    }
    if (f == "date-time")
      return quote + " " + formats().at("date") + " \"T\" " + formats().at("time") + " " + quote;
    auto it = formats().find(f);
    if (it == formats().end()) {
      return unsupported("json_schema: format '" + f + "' at " + schema_path(path) + " is not supported");
    }
    return quote + " " + it->second + " " + quote;
  }
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) return keyword_error("pattern", path, "must be a string");
    for (const char* other : {"minLength", "maxLength"}) {
      if (schema.contains(other)) return keyword_error(other, path, "alongside 'pattern' is not supported");
    }
    auto expr = regex_to_gbnf(schema["pattern"].get<std::string>(), true);
    if (!expr) return expr.status().with_context("json_schema: pattern at " + schema_path(path));
    return add_rule("pattern", quote + " " + *expr + " " + quote);
  }
  if (!schema.contains("minLength") && !schema.contains("maxLength")) return primitive("json-string");
  auto length = [&](const char* key, int64_t fallback) -> Expected<int64_t> {
    if (!schema.contains(key)) return fallback;
    const Json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return keyword_error(key, path, "must be a non-negative integer");
    if (v.get<int64_t>() > 10000) return keyword_error(key, path, "above 10000 is not supported");
    return v.get<int64_t>();
  };
  INFERD_ASSIGN_OR_RETURN(int64_t min, length("minLength", 0));
  INFERD_ASSIGN_OR_RETURN(int64_t max, length("maxLength", -1));
  if (max >= 0 && max < min) return keyword_error("minLength", path, "is above maxLength");
  std::string reps = "{";
  reps += std::to_string(min);
  reps += ',';
  if (max >= 0) reps += std::to_string(max);
  reps += '}';
  return quote + " " + primitive("json-char") + reps + " " + quote;
}

Expected<std::string> JsonSchemaCompiler::number_expr(const Json& schema, const std::string& path,
                                                      bool integer) {
  NumberBounds b;
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (!schema.contains(key)) continue;
    const Json& v = schema[key];
    const std::string k = key;
    if (v.is_boolean() && (k == "exclusiveMinimum" || k == "exclusiveMaximum")) {
      // Draft 4: a flag on minimum / maximum.
      (k == "exclusiveMinimum" ? b.lower_exclusive : b.upper_exclusive) = v.get<bool>();
      continue;
    }
    if (!v.is_number()) return keyword_error(key, path, "must be a number");
    const double x = v.get<double>();
    if (std::fabs(x) > 1e15) return keyword_error(key, path, "beyond 1e15 is not supported");
    if (k == "minimum") b.lower = b.lower ? std::max(*b.lower, x) : x;
    if (k == "maximum") b.upper = b.upper ? std::min(*b.upper, x) : x;
    if (k == "exclusiveMinimum") {
      b.lower = x;
      b.lower_exclusive = true;
    }
    if (k == "exclusiveMaximum") {
      b.upper = x;
      b.upper_exclusive = true;
    }
  }
  if (!b.lower && !b.upper) return primitive(integer ? "json-integer" : "json-number");
  auto expr = integer ? integer_in_bounds_gbnf(b) : number_in_bounds_gbnf(b, primitive("json-fraction"));
  if (!expr)
    return keyword_error(b.lower ? (b.lower_exclusive ? "exclusiveMinimum" : "minimum") : "maximum", path,
                         "leaves no " + std::string(integer ? "integer" : "number"));
  return add_rule(integer ? "integer" : "number", *expr);
}

// A JSON string (without escapes) that is none of `names`: a trie over their characters, where
// leaving the trie on any other character frees the rest.
std::string JsonSchemaCompiler::key_not_in(const std::vector<std::string>& names, const std::string& name) {
  struct Node {
    std::map<std::string, size_t> children;  // UTF-8 character -> node
    bool word_end = false;
  };
  std::vector<Node> nodes(1);
  for (const std::string& n : names) {
    size_t at = 0;
    for (size_t i = 0; i < n.size();) {
      const auto c = static_cast<unsigned char>(n[i]);
      const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      const std::string ch = n.substr(i, len);
      i += len;
      auto it = nodes[at].children.find(ch);
      if (it == nodes[at].children.end()) {
        nodes.emplace_back();
        it = nodes[at].children.emplace(ch, nodes.size() - 1).first;
      }
      at = it->second;
    }
    nodes[at].word_end = true;
  }
  const std::string chars = primitive("json-key-char");
  const std::string rest = chars + "*";
  std::vector<std::string> rule_names(nodes.size());
  for (size_t i = nodes.size(); i-- > 0;) rule_names[i] = unique_name(name + "-" + std::to_string(i));
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::string body;
    std::string others = "[^\"\\\\\\x00-\\x1F";
    for (const auto& [ch, child] : nodes[i].children) {
      body += (body.empty() ? "" : " | ") + gbnf_literal(ch) + " " + rule_names[child];
      if (ch == "]" || ch == "\\" || ch == "^" || ch == "-" || ch == "[") others += "\\";
      others += ch;
    }
    others += "]";
    body += (body.empty() ? "" : " | ") + others + " " + rest;
    if (!nodes[i].word_end) body += " | \"\"";
    rules_.emplace_back(rule_names[i], body);
  }
  return "\"\\\"\" " + rule_names[0] + " \"\\\"\"";
}

std::string JsonGrammarOptions::key() const {
  if (*this == JsonGrammarOptions{}) return "";
  return std::to_string(static_cast<int>(whitespace)) + (additional_properties_by_default ? "+" : "-") +
         whitespace_pattern;
}

Expected<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                          const JsonGrammarOptions& options) {
  JsonSchemaCompiler compiler(schema, options);
  return compiler.compile();
}

Expected<std::shared_ptr<const Grammar>> grammar_from_json_schema(const nlohmann::ordered_json& schema,
                                                                  const JsonGrammarOptions& options) {
  INFERD_ASSIGN_OR_RETURN(std::string gbnf, json_schema_to_gbnf(schema, options));
  auto g = parse_gbnf(gbnf);
  if (!g) return g.status().with_context("json_schema: the generated grammar");
  return g;
}

std::shared_ptr<const Grammar> any_json_grammar() {
  static const std::shared_ptr<const Grammar> g = [] {
    auto gbnf = JsonSchemaCompiler::any_object_gbnf();
    INFERD_CHECK(gbnf.has_value());
    auto parsed = parse_gbnf(*gbnf);
    INFERD_CHECK(parsed.has_value());
    return *parsed;
  }();
  return g;
}

Expected<std::shared_ptr<const Grammar>> any_json_grammar(const JsonGrammarOptions& options) {
  if (options == JsonGrammarOptions{}) return any_json_grammar();
  INFERD_ASSIGN_OR_RETURN(std::string gbnf, JsonSchemaCompiler::any_object_gbnf(options));
  auto g = parse_gbnf(gbnf);
  if (!g) return g.status().with_context("json_object: the generated grammar");
  return g;
}

}  // namespace inferd
