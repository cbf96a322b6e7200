#include "jinja/jinja_interpreter.h"

#include "jinja/jinja_format.h"

namespace inferd::jinja {

namespace {

// The `loop` variable of iteration i of n.
Value loop_object(size_t i, const std::vector<Value>& items) {
  const auto n = static_cast<int64_t>(items.size());
  const auto index = static_cast<int64_t>(i);
  Object loop;
  loop.set("index", Value::from_int(index + 1));
  loop.set("index0", Value::from_int(index));
  loop.set("revindex", Value::from_int(n - index));
  loop.set("revindex0", Value::from_int(n - index - 1));
  loop.set("first", Value::from_bool(i == 0));
  loop.set("last", Value::from_bool(index == n - 1));
  loop.set("length", Value::from_int(n));
  loop.set("depth", Value::from_int(1));
  loop.set("depth0", Value::from_int(0));
  loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  loop.set("nextitem", index + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  loop.set("cycle", Value::callable("loop.cycle", [i](const CallArgs& args) -> Expected<Value> {
             if (args.positional.empty()) return type_error("loop.cycle() needs at least one item");
             return args.positional[i % args.positional.size()];
           }));
  return Value::object(std::move(loop));
}

}  // namespace

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_) {
    const auto it = s->vars_.find(name);
    if (it != s->vars_.end()) return &it->second;
  }
  return nullptr;
}

Interpreter::Interpreter(const Value& context, const ChatTemplateLimits& limits)
    : context_(context),
      limits_(limits),
      builtin_limits_{limits.max_output_bytes, limits.max_loop_iterations, limits.max_value_depth} {}

Expected<std::string> Interpreter::render(const Program& program) {
  Scope root(nullptr);
  root_ = &root;
  outputs_.assign(1, std::string());
  INFERD_ASSIGN_OR_RETURN(Flow flow, exec_block(program.body, root));
  (void)flow;
  root_ = nullptr;
  return std::move(outputs_[0]);
}

Status Interpreter::write(std::string_view text) {
  std::string& out = outputs_.back();
  if (static_cast<int64_t>(out.size() + text.size()) > limits_.max_output_bytes) {
    return Status(StatusCode::kResourceExhausted, std::string("rendered text exceeds max_output_bytes (") +
                                                      std::to_string(limits_.max_output_bytes) + ")");
  }
  out += text;
  return Status::ok();
}

Status Interpreter::count_iteration() {
  if (++num_iterations_ > limits_.max_loop_iterations) {
    return Status(StatusCode::kResourceExhausted, std::string("more than max_loop_iterations (") +
                                                      std::to_string(limits_.max_loop_iterations) +
                                                      ") loop iterations and macro calls");
  }
  return Status::ok();
}

Expected<Interpreter::Flow> Interpreter::exec_block(const std::vector<StmtPtr>& body, Scope& scope) {
  for (const StmtPtr& s : body) {
    auto flow = exec(*s, scope);
    if (!flow.has_value()) return located(flow.status(), s->pos);
    if (*flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Expected<Interpreter::Flow> Interpreter::exec(const Stmt& s, Scope& scope) {
  switch (s.kind) {
    case StmtKind::kText: INFERD_RETURN_IF_ERROR(write(s.text)); break;
    case StmtKind::kOutput: {
      INFERD_ASSIGN_OR_RETURN(Value v, eval(*s.expr, scope));
      INFERD_RETURN_IF_ERROR(write(to_str(v)));
      break;
    }
    case StmtKind::kIf: return exec_if(s, scope);
    case StmtKind::kFor: INFERD_RETURN_IF_ERROR(exec_for(s, scope)); break;
    case StmtKind::kSet: {
      INFERD_ASSIGN_OR_RETURN(Value v, eval(*s.expr, scope));
      INFERD_RETURN_IF_ERROR(assign(s, std::move(v), scope));
      break;
    }
    case StmtKind::kSetBlock:
    case StmtKind::kFilterBlock: {
      Scope inner(&scope);
      INFERD_ASSIGN_OR_RETURN(std::string text, capture(s.body, inner));
      INFERD_ASSIGN_OR_RETURN(Value v,
                              apply_filter_chain(s.expr.get(), Value::from_string(std::move(text)), scope));
      if (s.kind == StmtKind::kSetBlock) {
        INFERD_RETURN_IF_ERROR(assign(s, std::move(v), scope));
      } else {
        INFERD_RETURN_IF_ERROR(write(to_str(v)));
      }
      break;
    }
    case StmtKind::kMacro: {
      const Stmt* macro = &s;
      scope.set(s.name, Value::callable(s.name, [this, macro](const CallArgs& args) {
                  return call_macro(*macro, args);
                }));
      break;
    }
    case StmtKind::kScope: {
      Scope inner(&scope);
      return exec_block(s.body, inner);
    }
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
  }
  return Flow::kNormal;
}

Expected<Interpreter::Flow> Interpreter::exec_if(const Stmt& s, Scope& scope) {
  for (const IfBranch& branch : s.branches) {
    INFERD_ASSIGN_OR_RETURN(Value condition, eval(*branch.condition, scope));
    if (truthy(condition)) return exec_block(branch.body, scope);
  }
  return exec_block(s.else_body, scope);
}

Status Interpreter::exec_for(const Stmt& s, Scope& scope) {
  INFERD_ASSIGN_OR_RETURN(Value iterable, eval(*s.expr, scope));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(iterable));
  if (s.loop_filter) {
    std::vector<Value> kept;
    for (Value& item : items) {
      INFERD_RETURN_IF_ERROR(count_iteration());
      Scope probe(&scope);
      INFERD_RETURN_IF_ERROR(bind_targets(s.targets, item, probe));
      INFERD_ASSIGN_OR_RETURN(Value keep, eval(*s.loop_filter, probe));
      if (truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Scope inner(&scope);
    INFERD_ASSIGN_OR_RETURN(Flow flow, exec_block(s.else_body, inner));
    (void)flow;
    return Status::ok();
  }
  for (size_t i = 0; i < items.size(); ++i) {
    INFERD_RETURN_IF_ERROR(count_iteration());
    Scope iteration(&scope);
    INFERD_RETURN_IF_ERROR(bind_targets(s.targets, items[i], iteration));
    iteration.set("loop", loop_object(i, items));
    INFERD_ASSIGN_OR_RETURN(Flow flow, exec_block(s.body, iteration));
    if (flow == Flow::kBreak) break;
  }
  return Status::ok();
}

Status Interpreter::bind_targets(const std::vector<std::string>& targets, const Value& value, Scope& scope) {
  if (targets.size() == 1) {
    scope.set(targets[0], value);
    return Status::ok();
  }
  if (!value.is_array())
    return type_error(std::string("cannot unpack non-iterable ") + type_name(value) + " object");
  const auto& items = value.items();
  if (items.size() != targets.size()) {
    return invalid_argument((items.size() > targets.size() ? "too many" : "not enough") +
                            std::string(" values to unpack (expected ") + std::to_string(targets.size()) +
                            std::string(", got ") + std::to_string(items.size()) + ")");
  }
  for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], items[i]);
  return Status::ok();
}

Status Interpreter::assign(const Stmt& s, Value value, Scope& scope) {
  if (s.attribute.empty()) return bind_targets(s.targets, value, scope);
  const Value target = lookup(s.targets[0], scope);
  if (!target.is_namespace()) return invalid_argument("cannot assign attribute on non-namespace object");
  if (s.attribute[0] == '_') {
    return invalid_argument(
        "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + s.attribute +
        "'");
  }
  if (value.holds_reference()) {
    return Status(StatusCode::kUnsupported,
                  "a namespace attribute cannot hold a namespace, macro or function");
  }
  target.namespace_attributes().set(s.attribute, std::move(value));
  return Status::ok();
}

Expected<std::string> Interpreter::capture(const std::vector<StmtPtr>& body, Scope& scope) {
  outputs_.emplace_back();
  auto flow = exec_block(body, scope);
  std::string text = std::move(outputs_.back());
  outputs_.pop_back();
  if (!flow.has_value()) return flow.status();
  return text;
}

Expected<Value> Interpreter::apply_filter_chain(const Expr* chain, Value input, Scope& scope) {
  if (chain == nullptr) return input;
  INFERD_ASSIGN_OR_RETURN(input, apply_filter_chain(chain->args[0].get(), std::move(input), scope));
  INFERD_ASSIGN_OR_RETURN(CallArgs args, eval_args(*chain, scope));
  auto result = apply_filter(chain->name, input, args, builtin_limits_);
  if (!result.has_value()) return located(result.status(), chain->pos);
  return result;
}

Expected<Value> Interpreter::call_macro(const Stmt& macro, const CallArgs& args) {
  if (call_depth_ >= limits_.max_recursion_depth) {
    return Status(StatusCode::kResourceExhausted,
                  std::string("macro calls nested deeper than max_recursion_depth (") +
                      std::to_string(limits_.max_recursion_depth) + ")");
  }
  INFERD_RETURN_IF_ERROR(count_iteration());
  const std::vector<std::string>& params = macro.targets;
  if (args.positional.size() > params.size()) {
    return type_error("macro '" + macro.name + std::string("' takes not more than ") +
                      std::to_string(params.size()) + " argument(s)");
  }
  Scope scope(root_);
  std::vector<bool> bound(params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    scope.set(params[i], args.positional[i]);
    bound[i] = true;
  }
  for (const auto& [key, value] : args.keywords) {
    size_t i = 0;
    while (i < params.size() && params[i] != key) ++i;
    if (i == params.size())
      return type_error("macro '" + macro.name + "' takes no keyword argument '" + key + "'");
    if (bound[i])
      return type_error("macro '" + macro.name + "' got multiple values for argument '" + key + "'");
    scope.set(params[i], value);
    bound[i] = true;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (macro.defaults[i] == nullptr) {
      scope.set(params[i], Value::undefined("parameter '" + params[i] + "' was not provided"));
      continue;
    }
    INFERD_ASSIGN_OR_RETURN(Value fallback, eval(*macro.defaults[i], scope));
    scope.set(params[i], std::move(fallback));
  }
  ++call_depth_;
  auto text = capture(macro.body, scope);
  --call_depth_;
  if (!text.has_value()) return text.status();
  return Value::from_string(std::move(text).value());
}

Value Interpreter::lookup(const std::string& name, const Scope& scope) const {
  if (const Value* v = scope.find(name)) return *v;
  if (context_.is_object()) {
    if (const Value* v = context_.object_value().find(name)) return *v;
  }
  if (auto global = find_global(name, builtin_limits_)) return *global;
  return Value::undefined("'" + name + "' is undefined");
}

Status located(const Status& s, SourcePos pos) {
  if (s.message().rfind("chat template line ", 0) == 0) return s;
  return error_at(pos, s.message(), s.code());
}

}  // namespace inferd::jinja
