// Python str and dict methods that chat templates call (`content.split('</think>')`,
// `message.get('x')`, ...), bound to their receiver as callables.
#include <algorithm>
#include <charconv>

#include "jinja/jinja_builtins.h"
#include "jinja/jinja_format.h"
#include "jinja/jinja_strings.h"

namespace inferd::jinja {

namespace {

constexpr std::string_view kOtherStrMethods[] = {
    "casefold",  "center",       "encode",    "expandtabs",  "format_map", "index",     "isascii",
    "isdecimal", "isidentifier", "isnumeric", "isprintable", "istitle",    "ljust",     "maketrans",
    "partition", "rindex",       "rjust",     "rpartition",  "swapcase",   "translate", "zfill"};

using Method = Expected<Value> (*)(const std::string& self, const CallArgs& args,
                                   const BuiltinLimits& limits);

std::optional<std::string> optional_string(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return to_str(v);
}

int64_t int_or(const Value& v, int64_t fallback) {
  return v.is_int() || v.is_bool() ? v.int_value() : fallback;
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.push_back(Value::from_string(std::move(p)));
  return Value::array(std::move(items));
}

// startswith / endswith: a str or a tuple of them.
Expected<Value> affix_test(const std::string& self, const CallArgs& args, bool prefix) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments(prefix ? "startswith" : "endswith", args, {"affix"}));
  std::vector<Value> candidates = a[0].is_array() ? a[0].items() : std::vector<Value>{a[0]};
  for (const Value& c : candidates) {
    if (!c.is_string()) return type_error("startswith/endswith arguments must be str or a tuple of str");
    const std::string& s = c.string_value();
    const bool hit =
        s.size() <= self.size() &&
        (prefix ? self.compare(0, s.size(), s) == 0 : self.compare(self.size() - s.size(), s.size(), s) == 0);
    if (hit) return Value::from_bool(true);
  }
  return Value::from_bool(false);
}

Expected<Value> m_startswith(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return affix_test(s, a, true);
}
Expected<Value> m_endswith(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return affix_test(s, a, false);
}

Expected<Value> split_common(const std::string& self, const CallArgs& args, bool from_right) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments(from_right ? "rsplit" : "split", args, {"sep", "maxsplit"}));
  const std::optional<std::string> sep = optional_string(a[0]);
  if (sep && sep->empty()) return invalid_argument("empty separator");
  const int64_t maxsplit = int_or(a[1], -1);
  return string_list(from_right ? py_rsplit(self, sep, maxsplit) : py_split(self, sep, maxsplit));
}

Expected<Value> m_split(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return split_common(s, a, false);
}
Expected<Value> m_rsplit(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return split_common(s, a, true);
}

Expected<Value> strip_common(const std::string& self, const CallArgs& args, bool left, bool right) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("strip", args, {"chars"}));
  return Value::from_string(py_strip(self, optional_string(a[0]), left, right));
}

Expected<Value> m_strip(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return strip_common(s, a, true, true);
}
Expected<Value> m_lstrip(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return strip_common(s, a, true, false);
}
Expected<Value> m_rstrip(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return strip_common(s, a, false, true);
}

Expected<Value> m_replace(const std::string& self, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("replace", args, {"old", "new", "count"}));
  if (!a[0].is_string() || !a[1].is_string()) return type_error("replace() arguments must be str");
  std::string out = py_replace(self, a[0].string_value(), a[1].string_value(), int_or(a[2], -1));
  INFERD_RETURN_IF_ERROR(check_string_size(out.size(), limits));
  return Value::from_string(std::move(out));
}

Expected<Value> no_args(std::string_view name, const CallArgs& args) {
  if (!args.positional.empty() || !args.keywords.empty())
    return type_error(std::string(name) + "() takes no arguments");
  return Value();
}

Expected<Value> m_upper(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  INFERD_RETURN_IF_ERROR(no_args("upper", a).status());
  return Value::from_string(py_upper(s));
}
Expected<Value> m_lower(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  INFERD_RETURN_IF_ERROR(no_args("lower", a).status());
  return Value::from_string(py_lower(s));
}
Expected<Value> m_capitalize(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  INFERD_RETURN_IF_ERROR(no_args("capitalize", a).status());
  return Value::from_string(py_capitalize(s));
}

Expected<Value> m_title(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  INFERD_RETURN_IF_ERROR(no_args("title", a).status());
  return Value::from_string(py_title(s));
}

Expected<Value> m_find(const std::string& s, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("find", args, {"sub"}));
  return Value::from_int(py_find(s, to_str(a[0])));
}

Expected<Value> m_count(const std::string& s, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("count", args, {"sub"}));
  return Value::from_int(py_count(s, to_str(a[0])));
}

Expected<Value> m_join(const std::string& self, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("join", args, {"iterable"}));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string())
      return type_error(std::string("sequence item ") + std::to_string(i) + ": expected str instance");
    if (i > 0) out += self;
    out += items[i].string_value();
    INFERD_RETURN_IF_ERROR(check_string_size(out.size(), limits));
  }
  return Value::from_string(std::move(out));
}

Expected<Value> m_splitlines(const std::string& s, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("splitlines", args, {"keepends"}));
  std::vector<std::string> lines;
  std::string line;
  for (size_t i = 0; i < s.size();) {
    const size_t begin = i;
    const char32_t c = next_code_point(s, &i);
    line.append(s, begin, i - begin);
    const bool brk = c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') line += s[i++];
    if (!truthy(a[0])) line.resize(line.size() - (i - begin));
    lines.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return string_list(std::move(lines));
}

// isdigit / isalpha / isalnum / isspace: every code point in the class (and at least one).
template <bool (*Pred)(char32_t)>
Expected<Value> char_class(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  INFERD_RETURN_IF_ERROR(no_args("is*", a).status());
  if (s.empty()) return Value::from_bool(false);
  for (size_t i = 0; i < s.size();) {
    if (!Pred(next_code_point(s, &i))) return Value::from_bool(false);
  }
  return Value::from_bool(true);
}
bool alnum(char32_t c) {
  return is_py_digit(c) || is_py_alpha(c);
}

Expected<Value> affix_remove(const std::string& self, const CallArgs& args, bool prefix) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments(prefix ? "removeprefix" : "removesuffix", args, {"affix"}));
  const std::string affix = to_str(a[0]);
  if (affix.size() > self.size()) return Value::from_string(self);
  if (prefix && self.compare(0, affix.size(), affix) == 0)
    return Value::from_string(self.substr(affix.size()));
  if (!prefix && self.compare(self.size() - affix.size(), affix.size(), affix) == 0) {
    return Value::from_string(self.substr(0, self.size() - affix.size()));
  }
  return Value::from_string(self);
}
Expected<Value> m_removeprefix(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return affix_remove(s, a, true);
}
Expected<Value> m_removesuffix(const std::string& s, const CallArgs& a, const BuiltinLimits&) {
  return affix_remove(s, a, false);
}

Expected<Value> m_format(const std::string& s, const CallArgs& a, const BuiltinLimits& limits);

struct MethodEntry {
  std::string_view name;
  Method fn;
};

constexpr MethodEntry kStrMethods[] = {
    {"startswith", m_startswith},
    {"endswith", m_endswith},
    {"split", m_split},
    {"rsplit", m_rsplit},
    {"strip", m_strip},
    {"lstrip", m_lstrip},
    {"rstrip", m_rstrip},
    {"replace", m_replace},
    {"upper", m_upper},
    {"lower", m_lower},
    {"capitalize", m_capitalize},
    {"title", m_title},
    {"find", m_find},
    {"count", m_count},
    {"join", m_join},
    {"splitlines", m_splitlines},
    {"format", m_format},
    {"isdigit", char_class<is_py_digit>},
    {"isalpha", char_class<is_py_alpha>},
    {"isalnum", char_class<alnum>},
    {"isspace", char_class<is_py_space>},
    {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix},
};

// str.format with {}, {0}, {name} fields and !s / !r conversions (no format specs).
Expected<Value> m_format(const std::string& s, const CallArgs& args, const BuiltinLimits& limits) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if ((c == '{' || c == '}') && i + 1 < s.size() && s[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') return invalid_argument("Single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = s.find('}', i);
    if (close == std::string::npos) return invalid_argument("Single '{' encountered in format string");
    std::string field = s.substr(i + 1, close - i - 1);
    if (field.find(':') != std::string::npos) {
      return Status(StatusCode::kUnsupported, "format specs in str.format() are not supported");
    }
    char conversion = 's';
    if (field.size() >= 2 && field[field.size() - 2] == '!') {
      conversion = field.back();
      field.resize(field.size() - 2);
    }
    const Value* v = nullptr;
    if (field.empty() ||
        std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t index = auto_index;
      if (field.empty()) {
        ++auto_index;
      } else if (std::from_chars(field.data(), field.data() + field.size(), index).ec != std::errc()) {
        return invalid_argument("Replacement index " + field + " out of range");
      }
      if (index >= args.positional.size())
        return invalid_argument(std::string("Replacement index ") + std::to_string(index) + " out of range");
      v = &args.positional[index];
    } else {
      for (const auto& [key, value] : args.keywords) {
        if (key == field) v = &value;
      }
      if (v == nullptr) return invalid_argument("KeyError: '" + field + "' in str.format()");
    }
    out += conversion == 'r' ? to_repr(*v) : to_str(*v);
    INFERD_RETURN_IF_ERROR(check_string_size(out.size(), limits));
    i = close;
  }
  return Value::from_string(std::move(out));
}

Expected<Value> dict_method(const Value& self, std::string_view name, const CallArgs& args) {
  const Object& object = self.object_value();
  if (name == "get") {
    INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("get", args, {"key", "default"}));
    const Value* v = a[0].is_string() ? object.find(a[0].string_value()) : nullptr;
    if (v != nullptr) return *v;
    return a[1].is_undefined() ? Value::none() : a[1];
  }
  INFERD_RETURN_IF_ERROR(no_args(name, args).status());
  if (name == "copy") return self;
  std::vector<Value> out;
  for (const auto& [key, value] : object.entries()) {
    if (name == "keys") out.push_back(Value::from_string(key));
    if (name == "values") out.push_back(value);
    if (name == "items") out.push_back(Value::array({Value::from_string(key), value}, true));
  }
  return Value::array(std::move(out));
}

// list.count(x) and list.index(x).
Expected<Value> list_method(const Value& self, std::string_view name, const CallArgs& args) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments(name, args, {"value"}));
  int64_t count = 0;
  for (size_t i = 0; i < self.items().size(); ++i) {
    if (!equals(self.items()[i], a[0])) continue;
    if (name == "index") return Value::from_int(static_cast<int64_t>(i));
    ++count;
  }
  if (name == "index") return invalid_argument(to_repr(a[0]) + " is not in list");
  return Value::from_int(count);
}

}  // namespace

std::optional<Value> find_method(const Value& receiver, std::string_view name, const BuiltinLimits& limits) {
  if (receiver.is_array() && (name == "count" || name == "index")) {
    const std::string method(name);
    return Value::callable("list." + method, [receiver, method](const CallArgs& args) {
      return list_method(receiver, method, args);
    });
  }
  if (receiver.is_object()) {
    if (name != "get" && name != "items" && name != "keys" && name != "values" && name != "copy")
      return std::nullopt;
    const std::string method(name);
    return Value::callable("dict." + method, [receiver, method](const CallArgs& args) {
      return dict_method(receiver, method, args);
    });
  }
  if (!receiver.is_string()) return std::nullopt;
  for (const MethodEntry& m : kStrMethods) {
    if (m.name != name) continue;
    const Method fn = m.fn;
    return Value::callable(
        std::string("str.") + std::string(name),
        [receiver, fn, limits](const CallArgs& args) { return fn(receiver.string_value(), args, limits); });
  }
  if (std::find(std::begin(kOtherStrMethods), std::end(kOtherStrMethods), name) !=
      std::end(kOtherStrMethods)) {
    const std::string method(name);
    return Value::callable("str." + method, [method](const CallArgs&) -> Expected<Value> {
      return Status(StatusCode::kUnsupported, "str." + method + "() is not supported in chat templates");
    });
  }
  return std::nullopt;
}

}  // namespace inferd::jinja
