// jinja2's builtin filters (the subset chat templates use) and transformers' `tojson`.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "jinja/jinja_builtins.h"
#include "jinja/jinja_format.h"
#include "jinja/jinja_list_filters.h"
#include "jinja/jinja_operators.h"
#include "jinja/jinja_strings.h"

namespace inferd::jinja {

namespace {

using FilterFn = Expected<Value> (*)(const Value& in, const CallArgs& args, const BuiltinLimits& limits);

std::optional<std::string> optional_string(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return to_str(v);
}

int64_t int_or(const Value& v, int64_t fallback) {
  return v.is_int() || v.is_bool() ? v.int_value() : fallback;
}
bool bool_or(const Value& v, bool fallback) {
  return v.is_undefined() ? fallback : truthy(v);
}

Expected<Value> f_abs(const Value& in, const CallArgs&, const BuiltinLimits&) {
  if (in.is_float()) return Value::from_float(std::fabs(in.float_value()));
  if (in.is_int() || in.is_bool()) return unary_op(in.int_value() < 0 ? Op::kNeg : Op::kPos, in);
  return type_error(std::string("bad operand type for abs(): '") + type_name(in) + "'");
}

Expected<Value> f_attr(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("attr", args, {"name"}));
  return get_attribute(in, to_str(a[0]), limits);
}

Expected<Value> f_capitalize(const Value& in, const CallArgs&, const BuiltinLimits&) {
  return Value::from_string(py_capitalize(to_str(in)));
}

Expected<Value> f_default(const Value& in, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments("default", args, {"default_value", "boolean"}));
  if (in.is_undefined() || (truthy(a[1]) && !truthy(in)))
    return a[0].is_undefined() ? Value::from_string("") : a[0];
  return in;
}

// Python's float(str): surrounding whitespace allowed, the whole rest must be a number.
std::optional<double> parse_float(const std::string& text) {
  const std::string s = py_strip(text, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

Expected<Value> f_float(const Value& in, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("float", args, {"default"}));
  const Value fallback = a[0].is_undefined() ? Value::from_float(0.0) : a[0];
  if (in.is_undefined()) return undefined_error(in);
  if (in.is_number()) return Value::from_float(in.float_value());
  if (in.is_string()) {
    if (auto d = parse_float(in.string_value())) return Value::from_float(*d);
  }
  return fallback;
}

Expected<Value> f_int(const Value& in, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("int", args, {"default", "base"}));
  const Value fallback = a[0].is_undefined() ? Value::from_int(0) : a[0];
  if (in.is_undefined()) return undefined_error(in);
  if (in.is_int() || in.is_bool()) return Value::from_int(in.int_value());
  double d = 0.0;
  if (in.is_float()) {
    d = in.float_value();
  } else if (in.is_string()) {
    const std::string s = py_strip(in.string_value(), std::nullopt, true, true);
    const int base = static_cast<int>(int_or(a[1], 10));
    char* end = nullptr;
    errno = 0;
    const long long v = s.empty() ? 0 : std::strtoll(s.c_str(), &end, base);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::from_int(v);
    const auto parsed = parse_float(s);
    if (!parsed) return fallback;
    d = *parsed;
  } else {
    return fallback;
  }
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
  return Value::from_int(static_cast<int64_t>(std::trunc(d)));
}

Expected<Value> f_length(const Value& in, const CallArgs&, const BuiltinLimits&) {
  switch (in.kind()) {
    case Value::Kind::kUndefined: return Value::from_int(0);
    case Value::Kind::kString:
      return Value::from_int(static_cast<int64_t>(count_code_points(in.string_value())));
    case Value::Kind::kArray: return Value::from_int(static_cast<int64_t>(in.items().size()));
    case Value::Kind::kObject: return Value::from_int(static_cast<int64_t>(in.object_value().size()));
    default: return type_error(std::string("object of type '") + type_name(in) + "' has no len()");
  }
}

Expected<Value> f_lower(const Value& in, const CallArgs&, const BuiltinLimits&) {
  return Value::from_string(py_lower(to_str(in)));
}

Expected<Value> f_upper(const Value& in, const CallArgs&, const BuiltinLimits&) {
  return Value::from_string(py_upper(to_str(in)));
}

Expected<Value> f_replace(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("replace", args, {"old", "new", "count"}));
  std::string out = py_replace(to_str(in), to_str(a[0]), to_str(a[1]), int_or(a[2], -1));
  INFERD_RETURN_IF_ERROR(check_string_size(out.size(), limits));
  return Value::from_string(std::move(out));
}

Expected<Value> f_round(const Value& in, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("round", args, {"precision", "method"}));
  if (!in.is_number())
    return type_error(std::string("type ") + type_name(in) + " doesn't define __round__ method");
  const std::string method = a[1].is_undefined() ? "common" : to_str(a[1]);
  const int64_t precision = int_or(a[0], 0);
  if (method == "common" && !in.is_float()) return Value::from_int(in.int_value());
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = in.float_value() * scale;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::from_float(r / scale);
}

Expected<Value> f_string(const Value& in, const CallArgs&, const BuiltinLimits&) {
  return Value::from_string(to_str(in));
}

Expected<Value> f_title(const Value& in, const CallArgs&, const BuiltinLimits&) {
  return Value::from_string(jinja_title(to_str(in)));
}

Expected<Value> f_tojson(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(
      std::vector<Value> a,
      bind_arguments("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions options;
  options.ensure_ascii = bool_or(a[0], false);
  if (a[1].is_int())
    options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(a[1].int_value(), 0, 64)), ' ');
  if (a[1].is_string()) options.indent = a[1].string_value();
  if (a[2].is_array()) {
    if (a[2].items().size() != 2) return type_error("tojson separators must be a pair of strings");
    options.item_separator = to_str(a[2].items()[0]);
    options.key_separator = to_str(a[2].items()[1]);
  }
  options.sort_keys = bool_or(a[3], false);
  INFERD_ASSIGN_OR_RETURN(std::string text, to_json(in, options));
  INFERD_RETURN_IF_ERROR(check_string_size(text.size(), limits));
  return Value::from_string(std::move(text));
}

Expected<Value> f_trim(const Value& in, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("trim", args, {"chars"}));
  return Value::from_string(py_strip(to_str(in), optional_string(a[0]), true, true));
}

Expected<Value> f_indent(const Value& in, const CallArgs& args, const BuiltinLimits& limits);

Expected<Value> f_safe(const Value& in, const CallArgs&, const BuiltinLimits&) {
  return Value::from_string(to_str(in));
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", list_filters::dictsort},
    {"first", list_filters::first},
    {"float", f_float},
    {"indent", f_indent},
    {"int", f_int},
    {"items", list_filters::items},
    {"join", list_filters::join},
    {"last", list_filters::last},
    {"length", f_length},
    {"list", list_filters::list},
    {"lower", f_lower},
    {"map", list_filters::map},
    {"max", list_filters::max},
    {"min", list_filters::min},
    {"reject", list_filters::reject},
    {"rejectattr", list_filters::rejectattr},
    {"replace", f_replace},
    {"reverse", list_filters::reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", list_filters::select},
    {"selectattr", list_filters::selectattr},
    {"sort", list_filters::sort},
    {"string", f_string},
    {"sum", list_filters::sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", list_filters::unique},
    {"upper", f_upper},
};

// Python's str.splitlines() boundaries.
bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < s.size();) {
    const size_t begin = i;
    const char32_t c = next_code_point(s, &i);
    if (!is_line_break(c)) {
      line.append(s, begin, i - begin);
      continue;
    }
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    lines.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

Expected<Value> f_indent(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("indent", args, {"width", "first", "blank"}));
  if (in.is_undefined()) return undefined_error(in);
  if (!in.is_string()) return type_error(std::string("indent needs a string, got ") + type_name(in));
  const std::string indention =
      a[0].is_string() ? a[0].string_value()
                       : std::string(static_cast<size_t>(std::clamp<int64_t>(int_or(a[0], 4), 0, 256)), ' ');
  const std::vector<std::string> lines = split_lines(to_str(in) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (truthy(a[2]) || !lines[i].empty())) out += indention;
    out += lines[i];
    INFERD_RETURN_IF_ERROR(check_string_size(out.size(), limits));
  }
  if (truthy(a[1])) out = indention + out;
  return Value::from_string(std::move(out));
}

}  // namespace

bool is_filter_name(std::string_view name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters),
                     [&](const FilterEntry& f) { return f.name == name; });
}

Expected<Value> apply_filter(std::string_view name, const Value& input, const CallArgs& args,
                             const BuiltinLimits& limits) {
  for (const FilterEntry& f : kFilters) {
    if (f.name == name) return f.fn(input, args, limits);
  }
  return Status(StatusCode::kUnsupported, std::string("unknown filter '") + std::string(name) + "'");
}

}  // namespace inferd::jinja
