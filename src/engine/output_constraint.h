// Output constraints of the front end's input side: a request's response_format / structured
// outputs, or its tool_choice "required" / named function, compiled into the grammar the
// sampler masks logits with (grammar/), through the grammar module's GrammarCache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/tool_call_parser.h"
#include "grammar/grammar.h"
#include "grammar/grammar_cache.h"

namespace inferd {

struct StructuredOutput;

// The GBNF that forces tool calls in `format` (hermes: <tool_call> blocks; llama3_json: bare
// objects joined by "; "): each call one of `tools`' functions (all of them, or only `name`
// when not empty) with arguments matching its parameter schema; at least one call, at most one
// unless `parallel`. Errors name the schema keyword inferd cannot compile.
Expected<std::string> tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                     const std::string& name, bool parallel);

// Compiles a structured-output request through `cache`.
Expected<std::shared_ptr<const Grammar>> compile_structured_output(const StructuredOutput& so,
                                                                   GrammarCache& cache);

}  // namespace inferd
