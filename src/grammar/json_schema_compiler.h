// JsonSchemaCompiler: a JSON schema to GBNF text (json_schema_to_gbnf in grammar.h). Each schema
// node becomes a GBNF expression, objects / arrays / $ref targets named rules; the JSON primitives
// (json-string, json-number, ...) are added once when used. Internal to the grammar module;
// docs/grammar.md lists the keywords and the whitespace policy.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "grammar/grammar.h"

namespace inferd {

class JsonSchemaCompiler final {
 public:
  explicit JsonSchemaCompiler(const nlohmann::ordered_json& root, JsonGrammarOptions options = {})
      : root_(root), options_(std::move(options)) {}

  // The whole grammar, start rule `root`. One use per compiler.
  Expected<std::string> compile();
  // `root ::= json-object` and the primitives: any JSON object.
  static Expected<std::string> any_object_gbnf(const JsonGrammarOptions& options = {});

 private:
  using Json = nlohmann::ordered_json;
  Expected<std::string> visit(const Json& schema, const std::string& path, const std::string& name);
  Expected<std::string> visit_object_schema(const Json& schema, const std::string& path,
                                            const std::string& name);
  Expected<std::string> visit_type(const Json& schema, const std::string& type, const std::string& path,
                                   const std::string& name);
  Expected<std::string> object_expr(const Json& schema, const std::string& path, const std::string& name);
  Expected<std::string> array_expr(const Json& schema, const std::string& path, const std::string& name);
  Expected<std::string> ref_expr(const std::string& ref, const std::string& path);
  // json_schema_scalars.cpp
  Expected<std::string> string_expr(const Json& schema, const std::string& path);
  Expected<std::string> number_expr(const Json& schema, const std::string& path, bool integer);
  std::string key_not_in(const std::vector<std::string>& names, const std::string& name);
  std::string primitive(const std::string& name);
  // The primitive's body: the fixed ones, and the structural ones (ws, json-object, json-member,
  // json-array) in the options' layout.
  std::string primitive_body(const std::string& name) const;
  // Punctuation with the whitespace the options allow around it (GBNF expressions).
  std::string colon();
  std::string comma();
  std::string open(char c);   // '{' or '['
  std::string close(char c);  // '}' or ']'
  // The options' whitespace pattern as a GBNF expression (kPattern), checked once.
  Status check_options();

  // Adds `name ::= body` under a unique name derived from `hint`; returns the name.
  std::string add_rule(const std::string& hint, const std::string& body);
  std::string unique_name(const std::string& hint);
  Status keyword_error(const std::string& keyword, const std::string& path, const std::string& what) const;

  static constexpr int kMaxDepth = 64;  // subschemas nested in one another, $ref chains included

  const Json& root_;
  JsonGrammarOptions options_;
  std::string ws_expr_;                                     // kPattern: the pattern's GBNF
  std::vector<std::pair<std::string, std::string>> rules_;  // in order of definition
  std::set<std::string> names_;
  std::map<std::string, int> last_suffix_;        // unique_name(): base -> the last suffix it gave
  int depth_ = 0;                                 // visit() calls in progress
  std::map<std::string, std::string> ref_rules_;  // $ref -> rule name
};

// Path for messages: "/" for the root.
inline std::string schema_path(const std::string& path) {
  return path.empty() ? "/" : path;
}

}  // namespace inferd
