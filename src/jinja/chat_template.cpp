#include "jinja/chat_template.h"

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>

#include "jinja/jinja_interpreter.h"
#include "jinja/jinja_lexer.h"
#include "jinja/jinja_parser.h"

namespace inferd {

namespace {

// Exceptions never leave the module (std::bad_alloc is the only one expected).
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "chat template: out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("chat template: ") + e.what());
  }
}

}  // namespace

Status ChatTemplateLimits::validate() const {
  if (max_recursion_depth <= 0)
    return invalid_argument("chat template limits: max_recursion_depth must be > 0");
  if (max_output_bytes <= 0) return invalid_argument("chat template limits: max_output_bytes must be > 0");
  if (max_loop_iterations <= 0)
    return invalid_argument("chat template limits: max_loop_iterations must be > 0");
  if (max_value_depth <= 0) return invalid_argument("chat template limits: max_value_depth must be > 0");
  return Status::ok();
}

Expected<ChatTemplate> ChatTemplate::compile(const std::string& source, const ChatTemplateLimits& limits) {
  return guarded([&]() -> Expected<ChatTemplate> {
    INFERD_RETURN_IF_ERROR(limits.validate());
    INFERD_ASSIGN_OR_RETURN(jinja::Program program, jinja::parse_template(source));
    INFERD_ASSIGN_OR_RETURN(std::vector<jinja::Token> tokens, jinja::tokenize(source));
    std::vector<std::string> names;
    for (jinja::Token& t : tokens) {
      if (t.kind == jinja::TokenKind::kName) names.push_back(std::move(t.text));
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return ChatTemplate(std::make_shared<const jinja::Program>(std::move(program)),
                        std::make_shared<const std::vector<std::string>>(std::move(names)), limits);
  });
}

bool ChatTemplate::mentions(std::string_view name) const {
  return std::binary_search(names_->begin(), names_->end(), name);
}

template <typename Json>
Expected<std::string> ChatTemplate::render_json(const Json& context) const {
  return guarded([&]() -> Expected<std::string> {
    if (!context.is_object()) return invalid_argument("chat template context must be a JSON object");
    INFERD_ASSIGN_OR_RETURN(jinja::Value values, jinja::value_from_json(context, limits_.max_value_depth));
    return jinja::Interpreter(values, limits_).render(*program_);
  });
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_json(context);
}

Expected<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return render_json(context);
}

}  // namespace inferd
