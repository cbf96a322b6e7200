#include "grammar/json_schema_compiler.h"

#include <algorithm>

#include "grammar/grammar.h"

namespace inferd {

namespace {

// Keywords that only annotate: accepted and ignored.
const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title",     "description",      "$schema",        "$id",
                                          "$comment",  "default",          "examples",       "readOnly",
                                          "writeOnly", "deprecated",       "$defs",          "definitions",
                                          "$anchor",   "contentMediaType", "contentEncoding"};
  return k;
}

// Keywords that constrain and are compiled.
const std::set<std::string>& constraint_keywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "nullable"};
  return k;
}

std::string escape_pointer_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

bool has_any(const nlohmann::ordered_json& s, std::initializer_list<const char*> keys) {
  return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
}

}  // namespace

Status JsonSchemaCompiler::keyword_error(const std::string& keyword, const std::string& path,
                                         const std::string& what) const {
  return unsupported("json_schema: keyword '" + keyword + "' at " + schema_path(path) + " " + what);
}

std::string JsonSchemaCompiler::unique_name(const std::string& hint) {
  std::string base;
  for (char c : hint) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    base += word ? c : '-';
  }
  if (base.empty()) base = "r";
  std::string name = base;
  if (names_.contains(name)) {
    // The next free suffix after the last one given: names are never freed, so the ones below it
    // are taken (counting up from 1 each time made many rules of one name quadratic).
    int& last = last_suffix_[base];
    do {
      name = base + "-" + std::to_string(++last);
    } while (names_.contains(name));
  }
  names_.insert(name);
  return name;
}

std::string JsonSchemaCompiler::add_rule(const std::string& hint, const std::string& body) {
  const std::string name = unique_name(hint);
  rules_.emplace_back(name, body);
  return name;
}

Expected<std::string> JsonSchemaCompiler::compile() {
  INFERD_RETURN_IF_ERROR(check_options());
  names_.insert("root");
  INFERD_ASSIGN_OR_RETURN(std::string expr, visit(root_, "", "root"));
  std::string out = "root ::= " + expr + "\n";
  for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
  return out;
}

Expected<std::string> JsonSchemaCompiler::any_object_gbnf(const JsonGrammarOptions& options) {
  static const nlohmann::ordered_json kEmpty = nlohmann::ordered_json::object();
  JsonSchemaCompiler c(kEmpty, options);
  INFERD_RETURN_IF_ERROR(c.check_options());
  const std::string object = c.primitive("json-object");
  std::string out = "root ::= " + object + "\n";
  for (const auto& [name, body] : c.rules_) out += name + " ::= " + body + "\n";
  return out;
}

Expected<std::string> JsonSchemaCompiler::visit(const Json& schema, const std::string& path,
                                                const std::string& name) {
  // Compiling recurses once per level of subschemas (and of $ref chains): bounded, so that a
  // request cannot overflow the server's stack.
  struct Level {
    int* depth;
    explicit Level(int* d) : depth(d) { ++*depth; }
    ~Level() { --*depth; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;
  } level(&depth_);
  if (depth_ > kMaxDepth) {
    return unsupported("json_schema: the schema at " + schema_path(path) + " is nested deeper than " +
                       std::to_string(kMaxDepth) + " levels");
  }
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return primitive("json-value");
    return unsupported("json_schema: schema 'false' at " + schema_path(path) + " admits no value");
  }
  if (!schema.is_object()) {
    return invalid_argument("json_schema: the schema at " + schema_path(path) +
                            " is not an object or a boolean");
  }
  for (const auto& [key, value] : schema.items()) {
    if (!annotation_keywords().contains(key) && !constraint_keywords().contains(key)) {
      return keyword_error(key, path, "is not supported");
    }
  }
  return visit_object_schema(schema, path, name);
}

Expected<std::string> JsonSchemaCompiler::visit_object_schema(const Json& schema, const std::string& path,
                                                              const std::string& name) {
  // Combinators and references stand alone: other constraints beside them are not merged.
  for (const char* alone : {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"}) {
    if (!schema.contains(alone)) continue;
    for (const auto& [key, value] : schema.items()) {
      const bool typed_literal =
          key == "type" && (std::string(alone) == "enum" || std::string(alone) == "const");
      if (key != alone && key != "nullable" && !typed_literal && constraint_keywords().contains(key)) {
        return keyword_error(key, path, std::string("alongside '") + alone + "' is not supported");
      }
    }
  }
  std::string nullable_suffix;
  if (schema.contains("nullable")) {
    if (!schema["nullable"].is_boolean()) return keyword_error("nullable", path, "must be a boolean");
    if (schema["nullable"].get<bool>()) nullable_suffix = " | " + primitive("json-null");
  }
  if (schema.contains("$ref")) {
    if (!schema["$ref"].is_string()) return keyword_error("$ref", path, "must be a string");
    INFERD_ASSIGN_OR_RETURN(std::string e, ref_expr(schema["$ref"].get<std::string>(), path));
    return nullable_suffix.empty() ? e : "(" + e + nullable_suffix + ")";
  }
  if (schema.contains("const")) return "(" + gbnf_literal(schema["const"].dump()) + nullable_suffix + ")";
  if (schema.contains("enum")) {
    const Json& values = schema["enum"];
    if (!values.is_array() || values.empty()) return keyword_error("enum", path, "must be a non-empty array");
    // As a radix tree: a large enum would otherwise be as many parses alive at once (docs/grammar.md).
    std::vector<std::string> texts;
    texts.reserve(values.size());
    for (const Json& v : values) texts.push_back(v.dump());
    auto tree = gbnf_alternatives_tree(
        std::move(texts), [&](const std::string& body) { return add_rule(name + "-enum", body); });
    if (!tree) return keyword_error("enum", path, tree.status().message());
    return "(" + *tree + nullable_suffix + ")";
  }
  for (const char* combinator : {"anyOf", "oneOf", "allOf"}) {
    if (!schema.contains(combinator)) continue;
    const Json& list = schema[combinator];
    const std::string sub = path + "/" + combinator;
    if (!list.is_array() || list.empty()) return keyword_error(combinator, path, "must be a non-empty array");
    if (std::string(combinator) == "allOf" && list.size() != 1) {
      return keyword_error(combinator, path,
                           "with " + std::to_string(list.size()) + " schemas is not supported (one only)");
    }
    // oneOf as anyOf: docs/grammar.md (alternatives should not overlap).
    std::string out = "(";
    for (size_t i = 0; i < list.size(); ++i) {
      INFERD_ASSIGN_OR_RETURN(std::string e,
                              visit(list[i], sub + "/" + std::to_string(i), name + "-" + std::to_string(i)));
      out += (i > 0 ? " | " : "") + e;
    }
    return out + nullable_suffix + ")";
  }
  std::vector<std::string> types;
  if (schema.contains("type")) {
    const Json& t = schema["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty() &&
               std::all_of(t.begin(), t.end(), [](const Json& x) { return x.is_string(); })) {
      for (const Json& x : t) types.push_back(x.get<std::string>());
    } else {
      return keyword_error("type", path, "must be a type name or a non-empty array of them");
    }
  } else if (has_any(schema, {"properties", "required", "additionalProperties"})) {
    types = {"object"};
  } else if (has_any(schema, {"items", "prefixItems", "minItems", "maxItems"})) {
    types = {"array"};
  } else if (has_any(schema, {"minLength", "maxLength", "pattern", "format"})) {
    types = {"string"};
  } else if (has_any(schema, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
    types = {"number"};
  } else {
    return nullable_suffix.empty() ? primitive("json-value")
                                   : "(" + primitive("json-value") + nullable_suffix + ")";
  }
  std::string out = "(";
  for (size_t i = 0; i < types.size(); ++i) {
    INFERD_ASSIGN_OR_RETURN(std::string e, visit_type(schema, types[i], path, name));
    out += (i > 0 ? " | " : "") + e;
  }
  return out + nullable_suffix + ")";
}

Expected<std::string> JsonSchemaCompiler::visit_type(const Json& schema, const std::string& type,
                                                     const std::string& path, const std::string& name) {
  if (type == "object") return object_expr(schema, path, name);
  if (type == "array") return array_expr(schema, path, name);
  if (type == "string") return string_expr(schema, path);
  if (type == "integer") return number_expr(schema, path, true);
  if (type == "number") return number_expr(schema, path, false);
  if (type == "boolean") return primitive("json-boolean");
  if (type == "null") return primitive("json-null");
  return unsupported("json_schema: type '" + type + "' at " + schema_path(path) +
                     " is not a JSON schema type");
}

Expected<std::string> JsonSchemaCompiler::ref_expr(const std::string& ref, const std::string& path) {
  if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
  if (ref.empty() || ref[0] != '#') {
    return keyword_error("$ref", path,
                         "'" + ref + "' is not supported (only references inside the schema, '#...')");
  }
  const Json* target = &root_;
  if (ref != "#") {
    try {
      target = &root_.at(nlohmann::ordered_json::json_pointer(ref.substr(1)));
    } catch (const nlohmann::json::exception&) {
      return invalid_argument("json_schema: $ref '" + ref + "' at " + schema_path(path) +
                              " points at nothing");
    }
  }
  // Named before its body is compiled, so a recursive reference finds it.
  std::string hint = ref == "#" ? "root-ref" : ref.substr(ref.find_last_of('/') + 1);
  const std::string name = unique_name(hint);
  ref_rules_.emplace(ref, name);
  const size_t at = rules_.size();
  rules_.emplace_back(name, "");
  INFERD_ASSIGN_OR_RETURN(std::string body, visit(*target, ref.substr(1), name));
  rules_[at].second = body;
  return name;
}

Expected<std::string> JsonSchemaCompiler::object_expr(const Json& schema, const std::string& path,
                                                      const std::string& name) {
  struct Property {
    std::string key;
    std::string value;
    bool required = false;
  };
  std::vector<Property> props;
  std::set<std::string> required;
  if (schema.contains("required")) {
    const Json& r = schema["required"];
    if (!r.is_array()) return keyword_error("required", path, "must be an array of names");
    for (const Json& k : r) {
      if (!k.is_string()) return keyword_error("required", path, "must be an array of names");
      required.insert(k.get<std::string>());
    }
  }
  if (schema.contains("properties")) {
    const Json& p = schema["properties"];
    if (!p.is_object()) return keyword_error("properties", path, "must be an object");
    for (const auto& [key, sub] : p.items()) {
      INFERD_ASSIGN_OR_RETURN(
          std::string v, visit(sub, path + "/properties/" + escape_pointer_token(key), name + "-" + key));
      props.push_back({key, v, required.contains(key)});
    }
  }
  for (const std::string& key : required) {
    if (std::none_of(props.begin(), props.end(), [&](const Property& p) { return p.key == key; })) {
      props.push_back({key, primitive("json-value"), true});
    }
  }
  // Extra keys: only with additionalProperties true or a schema (absent: none, docs/grammar.md,
  // unless the options make absent mean true).
  std::string extra;
  static const Json kAnyValue = true;
  const Json* a = schema.contains("additionalProperties")     ? &schema["additionalProperties"]
                  : options_.additional_properties_by_default ? &kAnyValue
                                                              : nullptr;
  if (a != nullptr && (!a->is_boolean() || a->get<bool>())) {
    std::vector<std::string> names;
    for (const Property& p : props) names.push_back(p.key);
    INFERD_ASSIGN_OR_RETURN(std::string v, visit(*a, path + "/additionalProperties", name + "-additional"));
    extra = add_rule(name + "-additional-kv", key_not_in(names, name + "-key") + " " + colon() + " " + v);
  }
  const std::string sep = comma();
  std::string first_tail, rest_tail;  // after the properties: nothing written yet / something written
  if (!extra.empty()) {
    rest_tail = add_rule(name + "-rest", "( " + sep + " " + extra + " )*");
    first_tail = "( " + extra + " " + rest_tail + " )?";
  }
  for (size_t i = props.size(); i-- > 0;) {
    const Property& p = props[i];
    const std::string kv = gbnf_literal(nlohmann::ordered_json(p.key).dump()) + " " + colon() + " " + p.value;
    const std::string rest_here = sep + " " + kv + (rest_tail.empty() ? "" : " " + rest_tail);
    const std::string first_here = kv + (rest_tail.empty() ? "" : " " + rest_tail);
    std::string rest_body = rest_here, first_body = first_here;
    if (!p.required) {
      rest_body = rest_tail.empty() ? "( " + rest_here + " )?" : rest_here + " | " + rest_tail;
      first_body = first_tail.empty() ? "( " + first_here + " )?" : first_here + " | " + first_tail;
    }
    rest_tail = add_rule(name + "-after-" + p.key, rest_body);
    first_tail = add_rule(name + "-from-" + p.key, first_body);
  }
  if (first_tail.empty()) return open('{') + " \"}\"";
  return open('{') + " " + first_tail + " " + close('}');
}

Expected<std::string> JsonSchemaCompiler::array_expr(const Json& schema, const std::string& path,
                                                     const std::string& name) {
  auto count = [&](const char* key) -> Expected<std::optional<int64_t>> {
    if (!schema.contains(key)) return std::optional<int64_t>();
    const Json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return keyword_error(key, path, "must be a non-negative integer");
    if (v.get<int64_t>() > 10000) return keyword_error(key, path, "above 10000 is not supported");
    return std::optional<int64_t>(v.get<int64_t>());
  };
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> min_items, count("minItems"));
  INFERD_ASSIGN_OR_RETURN(std::optional<int64_t> max_items, count("maxItems"));
  std::vector<std::string> prefix;
  const Json* prefix_json = schema.contains("prefixItems") ? &schema["prefixItems"]
                            : (schema.contains("items") && schema["items"].is_array()) ? &schema["items"]
                                                                                       : nullptr;
  const std::string prefix_key = schema.contains("prefixItems") ? "prefixItems" : "items";
  if (prefix_json != nullptr) {
    if (!prefix_json->is_array()) return keyword_error(prefix_key, path, "must be an array of schemas");
    for (size_t i = 0; i < prefix_json->size(); ++i) {
      INFERD_ASSIGN_OR_RETURN(std::string e,
                              visit((*prefix_json)[i], path + "/" + prefix_key + "/" + std::to_string(i),
                                    name + "-" + std::to_string(i)));
      prefix.push_back(e);
    }
  }
  // Items past the prefix: `items` (a schema), none with `items: false` or a tuple without
  // `items`, any value with neither.
  std::optional<std::string> item;
  if (schema.contains("items") && !schema["items"].is_array()) {
    if (!(schema["items"].is_boolean() && !schema["items"].get<bool>())) {
      INFERD_ASSIGN_OR_RETURN(std::string e, visit(schema["items"], path + "/items", name + "-item"));
      item = e;
    }
  } else if (prefix_json == nullptr) {
    item = primitive("json-value");
  }
  if (item && item->find(' ') != std::string::npos) item = add_rule(name + "-item", *item);
  const auto k = static_cast<int64_t>(prefix.size());
  const int64_t min = min_items.value_or(0);
  std::optional<int64_t> max = max_items;
  if (!item) max = max ? std::min(*max, k) : k;
  if (max && min > *max) {
    return keyword_error("minItems", path,
                         "asks for more items than the schema allows (" + std::to_string(*max) + ")");
  }
  const int64_t explicit_count = max ? std::min(std::max(k, min), *max) : std::max(k, min);
  const std::string comma_expr = comma();
  auto element = [&](int64_t j) { return j < k ? prefix[static_cast<size_t>(j)] : *item; };
  auto sep = [&](int64_t j) { return j == 0 ? std::string() : comma_expr + " "; };
  // The repeated tail after the explicit elements.
  std::string tail;
  const std::optional<int64_t> extra = max ? std::optional<int64_t>(*max - explicit_count) : std::nullopt;
  if (item && (!extra || *extra > 0)) {
    const std::string reps =
        extra ? "{0," + std::to_string(*extra - (explicit_count == 0 ? 1 : 0)) + "}" : "*";
    const std::string more = "( " + comma_expr + " " + *item + " )" + reps;
    tail = explicit_count == 0 ? "( " + *item + " " + more + " )?" : more;
  }
  std::string body = tail;
  for (int64_t j = explicit_count; j-- > min;) {
    body = "( " + sep(j) + element(j) + (body.empty() ? "" : " " + body) + " )?";
  }
  for (int64_t j = min; j-- > 0;) body = sep(j) + element(j) + (body.empty() ? "" : " " + body);
  if (body.empty()) return add_rule(name + "-array", open('[') + " \"]\"");
  return add_rule(name + "-array", open('[') + " " + body + " " + close(']'));
}

}  // namespace inferd
