// The GBNF reader: grammar text (llama.cpp's syntax) to rules of GbnfExpr; parse_gbnf() (grammar.h)
// is this then GrammarBuilder. Internal to the grammar module.
#pragma once

#include <string_view>
#include <vector>

#include "common/status.h"
#include "grammar/gbnf_ast.h"

namespace inferd {

// The rules of `text` in order of definition (a name defined twice: error). Errors read
// "gbnf: line L, column C: <what was expected>".
Expected<std::vector<GbnfRule>> read_gbnf(std::string_view text);

}  // namespace inferd
