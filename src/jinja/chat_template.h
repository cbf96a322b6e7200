// ChatTemplate: a model's Hugging Face chat template (a Jinja program) compiled once and
// rendered per request into the prompt text, byte-identical to transformers'
// apply_chat_template. Sits between the request's messages and Tokenizer::encode.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace inferd {

namespace jinja {
struct Program;
}  // namespace jinja

// Guards against hostile templates and inputs; exceeding one is an error, never a crash.
struct ChatTemplateLimits {
  int max_recursion_depth = 32;             // macro calls in progress at once
  int64_t max_output_bytes = 16 << 20;      // the rendered text, and any string built on the way
  int64_t max_loop_iterations = 1'000'000;  // loop iterations + macro calls in one render
  int max_value_depth = 128;                // nesting of lists/dicts, the context's included

  // Every limit must be positive; names the offending field.
  Status validate() const;
};

class ChatTemplate final {
 public:
  // Parses `source` (the tokenizer_config.json / GGUF `chat_template` text). A template that
  // does not parse, or uses a tag, filter or test that is not supported, is an error saying
  // what and where ("chat template line L:C: ...").
  static Expected<ChatTemplate> compile(const std::string& source, const ChatTemplateLimits& limits = {});

  // Renders with `context`: a JSON object whose keys become the template's variables
  // (messages, tools, add_generation_prompt, bos_token, eos_token, enable_thinking, ...).
  // Object keys keep their order, so `tojson` writes them as Python would. Errors (an
  // undefined value used where jinja2 fails, raise_exception(), a limit) name line:column.
  // Thread-safe: a compiled template is immutable and renders share nothing.
  Expected<std::string> render(const nlohmann::ordered_json& context) const;
  // Same for a nlohmann::json context (its objects iterate in sorted key order).
  Expected<std::string> render(const nlohmann::json& context) const;

  // Whether `name` occurs as a name in the template's tags and expressions (a variable, an
  // attribute, a macro): false means a context variable of that name cannot change the text.
  bool mentions(std::string_view name) const;

 private:
  ChatTemplate(std::shared_ptr<const jinja::Program> program,
               std::shared_ptr<const std::vector<std::string>> names, const ChatTemplateLimits& limits)
      : program_(std::move(program)), names_(std::move(names)), limits_(limits) {}

  template <typename Json>
  Expected<std::string> render_json(const Json& context) const;

  std::shared_ptr<const jinja::Program> program_;
  std::shared_ptr<const std::vector<std::string>> names_;  // sorted, unique
  ChatTemplateLimits limits_;
};

}  // namespace inferd
