// Expression evaluation of the Interpreter.
#include "jinja/jinja_format.h"
#include "jinja/jinja_interpreter.h"

namespace inferd::jinja {

Expected<Value> Interpreter::eval(const Expr& e, Scope& scope) {
  auto result = eval_node(e, scope);
  if (!result.has_value()) return located(result.status(), e.pos);
  if (result->depth() > limits_.max_value_depth) {
    return error_at(e.pos,
                    std::string("value nested deeper than max_value_depth (") +
                        std::to_string(limits_.max_value_depth) + ")",
                    StatusCode::kResourceExhausted);
  }
  return result;
}

Expected<Value> Interpreter::eval_node(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral: return e.constant;
    case ExprKind::kName: return lookup(e.name, scope);
    case ExprKind::kList:
    case ExprKind::kDict: return eval_collection(e, scope);
    case ExprKind::kGetAttr: {
      INFERD_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], scope));
      return get_attribute(obj, e.name, builtin_limits_);
    }
    case ExprKind::kGetItem: {
      INFERD_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], scope));
      INFERD_ASSIGN_OR_RETURN(Value key, eval(*e.args[1], scope));
      return get_item(obj, key, builtin_limits_);
    }
    case ExprKind::kSlice: {
      INFERD_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0], scope));
      Value parts[3] = {Value::none(), Value::none(), Value::none()};
      for (size_t i = 0; i < 3; ++i) {
        if (e.args[i + 1]) {
          INFERD_ASSIGN_OR_RETURN(parts[i], eval(*e.args[i + 1], scope));
        }
      }
      return get_slice(obj, parts[0], parts[1], parts[2]);
    }
    case ExprKind::kCall: {
      INFERD_ASSIGN_OR_RETURN(Value callee, eval(*e.args[0], scope));
      INFERD_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
      if (callee.is_undefined()) return undefined_error(callee);
      if (!callee.is_callable())
        return type_error(std::string("'") + type_name(callee) + "' object is not callable");
      return callee.callable_value().fn(args);
    }
    case ExprKind::kFilter: {
      INFERD_ASSIGN_OR_RETURN(Value input, eval(*e.args[0], scope));
      INFERD_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
      return apply_filter(e.name, input, args, builtin_limits_);
    }
    case ExprKind::kTest: {
      INFERD_ASSIGN_OR_RETURN(Value input, eval(*e.args[0], scope));
      INFERD_ASSIGN_OR_RETURN(CallArgs args, eval_args(e, scope));
      INFERD_ASSIGN_OR_RETURN(bool passed, apply_test(e.name, input, args));
      return Value::from_bool(passed);
    }
    case ExprKind::kUnary: {
      INFERD_ASSIGN_OR_RETURN(Value operand, eval(*e.args[0], scope));
      if (e.op == Op::kNot) return Value::from_bool(!truthy(operand));
      return unary_op(e.op, operand);
    }
    case ExprKind::kBinary: return eval_binary(e, scope);
    case ExprKind::kConcat: {
      std::string out;
      for (const ExprPtr& part : e.args) {
        INFERD_ASSIGN_OR_RETURN(Value v, eval(*part, scope));
        out += to_str(v);
        INFERD_RETURN_IF_ERROR(check_string_size(out.size(), builtin_limits_));
      }
      return Value::from_string(std::move(out));
    }
    case ExprKind::kCompare: return eval_compare(e, scope);
    case ExprKind::kCondition: {
      INFERD_ASSIGN_OR_RETURN(Value condition, eval(*e.args[0], scope));
      if (truthy(condition)) return eval(*e.args[1], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression was false and has no else");
    }
  }
  return Value();
}

Expected<Value> Interpreter::eval_collection(const Expr& e, Scope& scope) {
  if (e.kind == ExprKind::kList) {
    std::vector<Value> items;
    items.reserve(e.args.size());
    for (const ExprPtr& item : e.args) {
      INFERD_ASSIGN_OR_RETURN(Value v, eval(*item, scope));
      items.push_back(std::move(v));
    }
    return Value::array(std::move(items), e.is_tuple);
  }
  Object object;
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    INFERD_ASSIGN_OR_RETURN(Value key, eval(*e.args[i], scope));
    if (!key.is_string()) {
      return located(
          Status(StatusCode::kUnsupported, std::string("dict keys must be strings, got ") + type_name(key)),
          e.args[i]->pos);
    }
    INFERD_ASSIGN_OR_RETURN(Value value, eval(*e.args[i + 1], scope));
    object.set(key.string_value(), std::move(value));
  }
  return Value::object(std::move(object));
}

Expected<CallArgs> Interpreter::eval_args(const Expr& e, Scope& scope) {
  CallArgs args;
  for (size_t i = 1; i < e.args.size(); ++i) {
    INFERD_ASSIGN_OR_RETURN(Value v, eval(*e.args[i], scope));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [key, expr] : e.kwargs) {
    INFERD_ASSIGN_OR_RETURN(Value v, eval(*expr, scope));
    args.keywords.emplace_back(key, std::move(v));
  }
  return args;
}

Expected<Value> Interpreter::eval_binary(const Expr& e, Scope& scope) {
  INFERD_ASSIGN_OR_RETURN(Value left, eval(*e.args[0], scope));
  if (e.op == Op::kAnd) return truthy(left) ? eval(*e.args[1], scope) : left;
  if (e.op == Op::kOr) return truthy(left) ? left : eval(*e.args[1], scope);
  INFERD_ASSIGN_OR_RETURN(Value right, eval(*e.args[1], scope));
  return binary_op(e.op, left, right, builtin_limits_);
}

Expected<Value> Interpreter::eval_compare(const Expr& e, Scope& scope) {
  INFERD_ASSIGN_OR_RETURN(Value left, eval(*e.args[0], scope));
  for (size_t i = 0; i < e.compare_ops.size(); ++i) {
    INFERD_ASSIGN_OR_RETURN(Value right, eval(*e.args[i + 1], scope));
    INFERD_ASSIGN_OR_RETURN(bool holds, compare_op(e.compare_ops[i], left, right));
    if (!holds) return Value::from_bool(false);
    left = std::move(right);
  }
  return Value::from_bool(true);
}

}  // namespace inferd::jinja
