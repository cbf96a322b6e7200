#include "engine/output_constraint.h"

#include <cctype>

#include "engine/input_processor.h"

namespace inferd {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// `gbnf` with every rule name prefixed by `prefix` (literals, classes and comments untouched), so
// grammars can be combined without their rule names meeting.
std::string prefix_rule_names(const std::string& gbnf, const std::string& prefix) {
  std::string out;
  for (size_t i = 0; i < gbnf.size();) {
    const char c = gbnf[i];
    if (c == '"' || c == '[') {  // a literal or a class, with its escapes
      const char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < gbnf.size() && gbnf[j] != close) j += gbnf[j] == '\\' ? 2 : 1;
      out.append(gbnf, i, std::min(j + 1, gbnf.size()) - i);
      i = j + 1;
    } else if (c == '#') {
      const size_t j = gbnf.find('\n', i);
      out.append(gbnf, i, (j == std::string::npos ? gbnf.size() : j) - i);
      i = j == std::string::npos ? gbnf.size() : j;
    } else if (is_name_char(c) && (i == 0 || !is_name_char(gbnf[i - 1]))) {
      size_t j = i;
      while (j < gbnf.size() && is_name_char(gbnf[j])) ++j;
      const bool number = std::isdigit(static_cast<unsigned char>(c)) != 0;  // {m,n} bounds
      if (!number) out += prefix;
      out.append(gbnf, i, j - i);
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace

Expected<std::string> tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                     const std::string& name, bool parallel) {
  const char* args_key = format == ToolCallFormat::kHermes ? "arguments" : "parameters";
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const auto& t : tools) {
    const auto& f = t["function"];
    if (!name.empty() && f["name"] != name) continue;
    nlohmann::ordered_json params = f.contains("parameters") && f["parameters"].is_object()
                                        ? f["parameters"]
                                        : nlohmann::ordered_json{{"type", "object"}};
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", f["name"]}}}, {args_key, params}}},
                     {"required", {"name", args_key}},
                     {"additionalProperties", false}});
  }
  const nlohmann::ordered_json schema =
      calls.size() == 1 ? calls[0] : nlohmann::ordered_json{{"anyOf", calls}};
  INFERD_ASSIGN_OR_RETURN(std::string body, json_schema_to_gbnf(schema));
  std::string gbnf = prefix_rule_names(body, "call-");
  if (format == ToolCallFormat::kHermes) {
    gbnf += "\nroot ::= block" + std::string(parallel ? " (\"\\n\" block)*" : "") +
            "\nblock ::= \"<tool_call>\\n\" call-root \"\\n</tool_call>\"\n";
  } else {
    gbnf += "\nroot ::= call-root" + std::string(parallel ? " (\"; \" call-root)*" : "") + "\n";
  }
  return gbnf;
}

Expected<std::shared_ptr<const Grammar>> compile_structured_output(const StructuredOutput& so,
                                                                   GrammarCache& cache) {
  using Kind = StructuredOutput::Kind;
  switch (so.kind) {
    case Kind::kJsonObject: return cache.get({GrammarKind::kJsonObject, "", so.json});
    case Kind::kJsonSchema: return cache.get({GrammarKind::kJsonSchema, so.schema.dump(), so.json});
    case Kind::kRegex: return cache.get({GrammarKind::kRegex, so.text});
    case Kind::kGrammar: return cache.get({GrammarKind::kGbnf, so.text});
    case Kind::kChoice: return cache.get({GrammarKind::kChoice, nlohmann::json(so.choices).dump()});
  }
  return invalid_argument("unknown output constraint");
}

}  // namespace inferd
