// Shared builtin helpers, jinja2's tests and the global functions transformers provides.
#include "jinja/jinja_builtins.h"

#include <algorithm>
#include <ctime>

#include "jinja/jinja_format.h"
#include "jinja/jinja_operators.h"
#include "jinja/jinja_strings.h"

namespace inferd::jinja {

namespace {

constexpr std::string_view kTestNames[] = {
    "defined",     "undefined", "none",    "boolean",  "false",       "true",     "integer", "float",
    "number",      "string",    "mapping", "iterable", "sequence",    "callable", "odd",     "even",
    "divisibleby", "eq",        "equalto", "==",       "ne",          "!=",       "lt",      "lessthan",
    "<",           "le",        "<=",      "gt",       "greaterthan", ">",        "ge",      ">=",
    "in",          "lower",     "upper",   "sameas",   "escaped"};

Op comparison_of(std::string_view name) {
  if (name == "eq" || name == "equalto" || name == "==") return Op::kEq;
  if (name == "ne" || name == "!=") return Op::kNe;
  if (name == "lt" || name == "lessthan" || name == "<") return Op::kLt;
  if (name == "le" || name == "<=") return Op::kLe;
  if (name == "gt" || name == "greaterthan" || name == ">") return Op::kGt;
  if (name == "ge" || name == ">=") return Op::kGe;
  if (name == "in") return Op::kIn;
  return Op::kNone;
}

// str.islower() / str.isupper(): some cased character, and every cased one of that case.
bool has_case(const std::string& s, bool lower) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_code_point(s, &i);
    if (lower ? is_py_upper(c) : is_py_lower(c)) return false;
    cased = cased || is_py_cased(c);
  }
  return cased;
}

Expected<Value> range_global(const CallArgs& args, const BuiltinLimits& limits) {
  if (!args.keywords.empty() || args.positional.empty() || args.positional.size() > 3) {
    return type_error("range() takes 1 to 3 integer arguments");
  }
  for (const Value& v : args.positional) {
    if (!v.is_int() && !v.is_bool())
      return type_error(std::string("'") + type_name(v) + "' object cannot be interpreted as an integer");
  }
  const auto& p = args.positional;
  const int64_t start = p.size() == 1 ? 0 : p[0].int_value();
  const int64_t stop = p.size() == 1 ? p[0].int_value() : p[1].int_value();
  const int64_t step = p.size() == 3 ? p[2].int_value() : 1;
  if (step == 0) return invalid_argument("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(items.size()) >= limits.max_items) {
      return Status(StatusCode::kResourceExhausted, "range() longer than the loop iteration limit");
    }
    items.push_back(Value::from_int(i));
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
  }
  return Value::array(std::move(items));
}

// dict(mapping, **kwargs) and namespace(mapping, **kwargs).
Expected<Object> mapping_arguments(std::string_view callee, const CallArgs& args) {
  if (args.positional.size() > 1 || (args.positional.size() == 1 && !args.positional[0].is_object())) {
    return type_error(std::string(callee) + "() takes at most one mapping argument and keyword arguments");
  }
  Object out;
  if (!args.positional.empty()) out = args.positional[0].object_value();
  for (const auto& [key, value] : args.keywords) out.set(key, value);
  return out;
}

Expected<Value> namespace_global(const CallArgs& args) {
  INFERD_ASSIGN_OR_RETURN(Object attributes, mapping_arguments("namespace", args));
  for (const auto& [key, value] : attributes.entries()) {
    if (!key.empty() && key[0] == '_') {
      return invalid_argument(
          "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + key + "'");
    }
    if (value.holds_reference()) {
      return Status(StatusCode::kUnsupported,
                    "a namespace attribute cannot hold a namespace, macro or function");
    }
  }
  return Value::new_namespace(std::move(attributes));
}

Expected<Value> strftime_now(const CallArgs& args) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("strftime_now", args, {"format"}));
  if (!a[0].is_string()) return type_error("strftime_now() needs a format string");
  const std::string& format = a[0].string_value();
  if (format.empty() || format.size() > 256) return Value::from_string("");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string out(format.size() * 8 + 64, '\0');
  const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
  out.resize(n);
  return Value::from_string(std::move(out));
}

}  // namespace

Status type_error(const std::string& message) {
  return invalid_argument(message);
}

Status check_string_size(size_t bytes, const BuiltinLimits& limits) {
  if (static_cast<int64_t>(bytes) <= limits.max_string_bytes) return Status::ok();
  return Status(StatusCode::kResourceExhausted, std::string("a string longer than max_output_bytes (") +
                                                    std::to_string(limits.max_string_bytes) + ") was built");
}

Expected<std::vector<Value>> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return std::vector<Value>{};
    case Value::Kind::kArray: return v.items();
    case Value::Kind::kString: {
      std::vector<Value> out;
      const std::string& s = v.string_value();
      for (size_t i = 0; i < s.size();) {
        const size_t begin = i;
        next_code_point(s, &i);
        out.push_back(Value::from_string(s.substr(begin, i - begin)));
      }
      return out;
    }
    case Value::Kind::kObject: {
      std::vector<Value> out;
      for (const auto& [key, value] : v.object_value().entries()) out.push_back(Value::from_string(key));
      return out;
    }
    default: return type_error(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

Expected<std::vector<Value>> bind_arguments(std::string_view callee, const CallArgs& args,
                                            std::initializer_list<std::string_view> parameters) {
  const std::vector<std::string_view> names(parameters);
  std::vector<Value> out(names.size());
  std::vector<bool> given(names.size(), false);
  if (args.positional.size() > names.size()) {
    return type_error(std::string(callee) + std::string("() takes at most ") + std::to_string(names.size()) +
                      std::string(" argument(s) (") + std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    out[i] = args.positional[i];
    given[i] = true;
  }
  for (const auto& [key, value] : args.keywords) {
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end())
      return type_error(std::string(callee) + "() got an unexpected keyword argument '" + key + "'");
    const auto i = static_cast<size_t>(it - names.begin());
    if (given[i])
      return type_error(std::string(callee) + "() got multiple values for argument '" + key + "'");
    out[i] = value;
    given[i] = true;
  }
  return out;
}

bool is_test_name(std::string_view name) {
  return std::find(std::begin(kTestNames), std::end(kTestNames), name) != std::end(kTestNames);
}

Expected<bool> apply_test(std::string_view name, const Value& v, const CallArgs& args) {
  using Kind = Value::Kind;
  const bool takes_argument = name == "divisibleby" || name == "sameas" || comparison_of(name) != Op::kNone;
  if (!takes_argument && (!args.positional.empty() || !args.keywords.empty())) {
    return type_error("test '" + std::string(name) + "' takes no arguments");
  }
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "callable") return v.is_callable() || v.is_undefined();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") return has_case(to_str(v), name == "lower");
  if (name == "odd" || name == "even" || name == "divisibleby") {
    INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments(name, args, {"num"}));
    const Value divisor = name == "divisibleby" ? a[0] : Value::from_int(2);
    INFERD_ASSIGN_OR_RETURN(Value rest, binary_op(Op::kMod, v, divisor, BuiltinLimits{}));
    return equals(rest, Value::from_int(name == "odd" ? 1 : 0));
  }
  if (name == "sameas") {
    INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments(name, args, {"other"}));
    if (v.kind() != a[0].kind()) return false;
    if (v.kind() == Kind::kNone || v.kind() == Kind::kUndefined) return true;
    if (v.kind() == Kind::kBool) return v.bool_value() == a[0].bool_value();
    // CPython caches the small ints, so equal ones are the same object.
    if (v.kind() == Kind::kInt)
      return v.int_value() == a[0].int_value() && v.int_value() >= -5 && v.int_value() <= 256;
    return v.same_object(a[0]);
  }
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments(name, args, {"other"}));
  const Op op = comparison_of(name);
  if (op == Op::kNone)
    return Status(StatusCode::kUnsupported, std::string("unknown test '") + std::string(name) + "'");
  if (op == Op::kIn) return compare_op(Op::kIn, v, a[0]);
  return compare_op(op, v, a[0]);
}

std::optional<Value> find_global(std::string_view name, const BuiltinLimits& limits) {
  if (name == "range") {
    return Value::callable("range", [limits](const CallArgs& args) { return range_global(args, limits); });
  }
  if (name == "dict") {
    return Value::callable("dict", [](const CallArgs& args) -> Expected<Value> {
      INFERD_ASSIGN_OR_RETURN(Object object, mapping_arguments("dict", args));
      return Value::object(std::move(object));
    });
  }
  if (name == "namespace") return Value::callable("namespace", namespace_global);
  if (name == "raise_exception") {
    return Value::callable("raise_exception", [](const CallArgs& args) -> Expected<Value> {
      INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("raise_exception", args, {"message"}));
      return invalid_argument(std::string("the template raised an error: ") + to_str(a[0]));
    });
  }
  if (name == "strftime_now") return Value::callable("strftime_now", strftime_now);
  return std::nullopt;
}

}  // namespace inferd::jinja
