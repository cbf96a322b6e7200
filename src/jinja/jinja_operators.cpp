#include "jinja/jinja_operators.h"

#include <algorithm>
#include <cmath>

#include "jinja/jinja_format.h"
#include "jinja/jinja_strings.h"

namespace inferd::jinja {

namespace {

const char* op_symbol(Op op) {
  switch (op) {
    case Op::kAdd: return "+";
    case Op::kSub: return "-";
    case Op::kMul: return "*";
    case Op::kDiv: return "/";
    case Op::kFloorDiv: return "//";
    case Op::kMod: return "%";
    case Op::kPow: return "**";
    default: return "?";
  }
}

Status unsupported_operands(Op op, const Value& a, const Value& b) {
  return type_error(std::string("unsupported operand type(s) for ") + op_symbol(op) + std::string(": '") +
                    type_name(a) + std::string("' and '") + type_name(b) + "'");
}

Status overflow() {
  return invalid_argument("integer overflow (templates compute with 64-bit integers)");
}

Expected<Value> int_op(Op op, int64_t a, int64_t b) {
  int64_t r = 0;
  switch (op) {
    case Op::kAdd:
      if (__builtin_add_overflow(a, b, &r)) return overflow();
      return Value::from_int(r);
    case Op::kSub:
      if (__builtin_sub_overflow(a, b, &r)) return overflow();
      return Value::from_int(r);
    case Op::kMul:
      if (__builtin_mul_overflow(a, b, &r)) return overflow();
      return Value::from_int(r);
    case Op::kFloorDiv:
    case Op::kMod: {
      if (b == 0) return invalid_argument("integer division or modulo by zero");
      if (b == -1) {
        if (op == Op::kMod) return Value::from_int(0);
        if (a == INT64_MIN) return overflow();
        return Value::from_int(-a);
      }
      int64_t q = a / b;
      int64_t m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        --q;
        m += b;
      }
      return Value::from_int(op == Op::kFloorDiv ? q : m);
    }
    case Op::kPow: {
      if (b < 0) {
        if (a == 0) return invalid_argument("0 cannot be raised to a negative power");
        return Value::from_float(std::pow(static_cast<double>(a), static_cast<double>(b)));
      }
      int64_t result = 1;
      for (int64_t base = a, e = b; e > 0; e >>= 1) {
        if ((e & 1) != 0 && __builtin_mul_overflow(result, base, &result)) return overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::from_int(result);
    }
    default: return Value::from_float(static_cast<double>(a) / static_cast<double>(b));
  }
}

// CPython's float floor division and modulo.
Expected<Value> float_op(Op op, double a, double b) {
  switch (op) {
    case Op::kAdd: return Value::from_float(a + b);
    case Op::kSub: return Value::from_float(a - b);
    case Op::kMul: return Value::from_float(a * b);
    case Op::kPow: return Value::from_float(std::pow(a, b));
    default: break;
  }
  if (b == 0.0) return invalid_argument("float division by zero");
  if (op == Op::kDiv) return Value::from_float(a / b);
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  if (op == Op::kMod) return Value::from_float(mod);
  double floor_div = 0.0;
  if (div != 0.0) {
    floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
  } else {
    floor_div = std::copysign(0.0, a / b);
  }
  return Value::from_float(floor_div);
}

// s * n or list * n.
Expected<Value> repeat(const Value& sequence, int64_t n, const BuiltinLimits& limits) {
  n = std::max<int64_t>(n, 0);
  if (sequence.is_string()) {
    const std::string& s = sequence.string_value();
    if (!s.empty() && n > limits.max_string_bytes / static_cast<int64_t>(s.size())) {
      return check_string_size(static_cast<size_t>(limits.max_string_bytes) + 1, limits);
    }
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::from_string(std::move(out));
  }
  const auto& items = sequence.items();
  if (!items.empty() && n > limits.max_items / static_cast<int64_t>(items.size())) {
    return Status(StatusCode::kResourceExhausted, "list repetition would exceed the item limit");
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::array(std::move(out), sequence.is_tuple());
}

bool is_sequence(const Value& v) {
  return v.is_string() || v.is_array();
}

// Python's slice.indices(): the positions a slice visits in a sequence of length n.
Expected<std::vector<int64_t>> slice_positions(const Value& start, const Value& stop, const Value& step,
                                               int64_t n) {
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !v->is_undefined() && !v->is_int() && !v->is_bool()) {
      return type_error("slice indices must be integers or None");
    }
  }
  const int64_t by = step.is_int() || step.is_bool() ? step.int_value() : 1;
  if (by == 0) return invalid_argument("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (!v.is_int() && !v.is_bool()) return fallback;
    int64_t i = v.int_value();
    if (i < 0) i += n;
    if (i < 0) return by < 0 ? int64_t{-1} : int64_t{0};
    if (i >= n) return by < 0 ? n - 1 : n;
    return i;
  };
  const int64_t first = clamp(start, by < 0 ? n - 1 : 0);
  const int64_t end = clamp(stop, by < 0 ? -1 : n);
  std::vector<int64_t> out;
  for (int64_t i = first; by > 0 ? i < end : i > end; i += by) out.push_back(i);
  return out;
}

bool is_unsafe_dict_method(const std::string& name) {
  return name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update";
}

}  // namespace

Status undefined_error(const Value& v) {
  const std::string& hint = v.string_value();
  return invalid_argument(hint.empty() ? "an undefined value was used" : hint);
}

Expected<Value> binary_op(Op op, const Value& a, const Value& b, const BuiltinLimits& limits) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float() || op == Op::kDiv) {
      if (op == Op::kDiv && b.float_value() == 0.0) return invalid_argument("division by zero");
      return float_op(op, a.float_value(), b.float_value());
    }
    return int_op(op, a.int_value(), b.int_value());
  }
  if (op == Op::kAdd && a.is_string() && b.is_string()) {
    INFERD_RETURN_IF_ERROR(check_string_size(a.string_value().size() + b.string_value().size(), limits));
    return Value::from_string(a.string_value() + b.string_value());
  }
  if (op == Op::kAdd && a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
    if (static_cast<int64_t>(a.items().size() + b.items().size()) > limits.max_items) {
      return Status(StatusCode::kResourceExhausted, "list concatenation would exceed the item limit");
    }
    std::vector<Value> items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return Value::array(std::move(items), a.is_tuple());
  }
  if (op == Op::kMul && is_sequence(a) && (b.is_int() || b.is_bool()))
    return repeat(a, b.int_value(), limits);
  if (op == Op::kMul && is_sequence(b) && (a.is_int() || a.is_bool()))
    return repeat(b, a.int_value(), limits);
  if (op == Op::kMod && a.is_string()) {
    return Status(StatusCode::kUnsupported, "printf-style string formatting ('%') is not supported");
  }
  if (op == Op::kAdd && a.is_string()) {
    return type_error(std::string("can only concatenate str (not \"") + type_name(b) + "\") to str");
  }
  return unsupported_operands(op, a, b);
}

Expected<Value> unary_op(Op op, const Value& a) {
  if (a.is_undefined()) return undefined_error(a);
  if (a.is_float()) return Value::from_float(op == Op::kNeg ? -a.float_value() : a.float_value());
  if (a.is_int() || a.is_bool()) {
    if (op == Op::kPos) return Value::from_int(a.int_value());
    if (a.int_value() == INT64_MIN) return overflow();
    return Value::from_int(-a.int_value());
  }
  return type_error(std::string("bad operand type for unary ") + (op == Op::kNeg ? "-" : "+") +
                    std::string(": '") + type_name(a) + "'");
}

Expected<bool> compare_op(Op op, const Value& a, const Value& b) {
  switch (op) {
    case Op::kEq: return equals(a, b);
    case Op::kNe: return !equals(a, b);
    case Op::kIn:
    case Op::kNotIn: {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) {
          if (a.is_undefined()) return undefined_error(a);
          return type_error(std::string("'in <string>' requires string as left operand, not ") +
                            type_name(a));
        }
        found = b.string_value().find(a.string_value()) != std::string::npos;
      } else if (b.is_array()) {
        for (const Value& item : b.items()) found = found || equals(a, item);
      } else if (b.is_object()) {
        if ((a.is_array() && !a.is_tuple()) || a.is_object()) {
          return type_error(std::string("unhashable type: '") + type_name(a) + "'");
        }
        found = a.is_string() && b.object_value().find(a.string_value()) != nullptr;
      } else if (!b.is_undefined()) {
        return type_error(std::string("argument of type '") + type_name(b) + "' is not iterable");
      }
      return op == Op::kIn ? found : !found;
    }
    default: break;
  }
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  INFERD_ASSIGN_OR_RETURN(int c, compare(a, b));
  switch (op) {
    case Op::kLt: return c < 0;
    case Op::kLe: return c <= 0;
    case Op::kGt: return c > 0;
    default: return c >= 0;
  }
}

Expected<Value> get_attribute(const Value& obj, const std::string& name, const BuiltinLimits& limits) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (obj.is_object() && is_unsafe_dict_method(name)) {
    return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe");
  }
  if (auto method = find_method(obj, name, limits)) return *method;
  if (obj.is_object()) {
    if (const Value* v = obj.object_value().find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.namespace_attributes().find(name)) return *v;
  }
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
}

Expected<Value> get_item(const Value& obj, const Value& key, const BuiltinLimits& limits) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (is_sequence(obj) && (key.is_int() || key.is_bool())) {
    const std::vector<size_t> offsets =
        obj.is_string() ? code_point_offsets(obj.string_value()) : std::vector<size_t>{};
    const auto n = static_cast<int64_t>(obj.is_string() ? offsets.size() - 1 : obj.items().size());
    const int64_t i = key.int_value() < 0 ? key.int_value() + n : key.int_value();
    if (i < 0 || i >= n) {
      return Value::undefined(type_name(obj) + std::string(" object has no element ") +
                              std::to_string(key.int_value()));
    }
    const auto at = static_cast<size_t>(i);
    if (obj.is_array()) return obj.items()[at];
    return Value::from_string(obj.string_value().substr(offsets[at], offsets[at + 1] - offsets[at]));
  }
  if ((obj.is_object() || obj.is_namespace()) && key.is_string()) {
    const Object& o = obj.is_object() ? obj.object_value() : obj.namespace_attributes();
    if (const Value* v = o.find(key.string_value())) return *v;
  }
  if (key.is_string()) return get_attribute(obj, key.string_value(), limits);
  return Value::undefined(std::string("'") + type_name(obj) + std::string(" object' has no element ") +
                          to_repr(key));
}

Expected<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (!is_sequence(obj))
    return Value::undefined(std::string("'") + type_name(obj) + " object' cannot be sliced");
  if (obj.is_array()) {
    INFERD_ASSIGN_OR_RETURN(std::vector<int64_t> positions,
                            slice_positions(start, stop, step, static_cast<int64_t>(obj.items().size())));
    std::vector<Value> out;
    out.reserve(positions.size());
    for (int64_t i : positions) out.push_back(obj.items()[static_cast<size_t>(i)]);
    return Value::array(std::move(out), obj.is_tuple());
  }
  const std::string& s = obj.string_value();
  const std::vector<size_t> offsets = code_point_offsets(s);
  INFERD_ASSIGN_OR_RETURN(std::vector<int64_t> positions,
                          slice_positions(start, stop, step, static_cast<int64_t>(offsets.size() - 1)));
  std::string out;
  for (int64_t i : positions) {
    const auto at = static_cast<size_t>(i);
    out.append(s, offsets[at], offsets[at + 1] - offsets[at]);
  }
  return Value::from_string(std::move(out));
}

}  // namespace inferd::jinja
