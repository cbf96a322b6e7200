// Jinja parser: tokens of a chat template to its syntax tree, following jinja2's grammar and
// operator precedence. Second stage of ChatTemplate::compile.
#pragma once

#include <string_view>

#include "common/status.h"
#include "jinja/jinja_ast.h"

namespace inferd::jinja {

// Statements and expressions nest at most this deep; deeper templates are an error (no stack
// exhaustion on hostile input).
inline constexpr int kMaxParseNesting = 100;
inline constexpr int kMaxExprDepth = 200;

// The syntax tree of `source`. Errors say what was expected and where (line:column); unknown
// filters, tests and tags are errors here, as in jinja2.
Expected<Program> parse_template(std::string_view source);

}  // namespace inferd::jinja
