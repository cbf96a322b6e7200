#include "jinja/jinja_format.h"

#include <utf8proc.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/jinja_strings.h"

namespace inferd::jinja {

namespace {

// Python's str.isprintable() for one code point: not a control, format, surrogate, private,
// unassigned or separator character (the ASCII space excepted).
bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: return false;
    default: return true;
  }
}

void append_escape(char32_t c, std::string* out) {
  char buf[16];
  if (c < 0x100) {
    std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
  } else if (c < 0x10000) {
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
  } else {
    std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
  }
  *out += buf;
}

std::string repr_items(const Value& v) {
  std::string out;
  const auto& items = v.items();
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += to_repr(items[i]);
  }
  if (v.is_tuple()) return "(" + out + (items.size() == 1 ? ",)" : ")");
  return "[" + out + "]";
}

std::string repr_object(const Object& object) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : object.entries()) {
    if (!first) out += ", ";
    first = false;
    out += py_repr_string(key) + std::string(": ") + to_repr(value);
  }
  return out + "}";
}

void append_hex4(unsigned v, std::string* out) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", v);
  *out += buf;
}

// json.dumps of a str: escapes `"`, `\` and control characters; with ensure_ascii every
// non-ASCII code point as \uXXXX (UTF-16 surrogate pairs beyond the BMP).
void append_json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t begin = i;
    const char32_t c = next_code_point(s, &i);
    switch (c) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7f && c < 0x110000)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        append_hex4(static_cast<unsigned>(0xd800 + (v >> 10)), out);
        append_hex4(static_cast<unsigned>(0xdc00 + (v & 0x3ff)), out);
      } else {
        append_hex4(static_cast<unsigned>(c), out);
      }
    } else {
      out->append(s, begin, i - begin);
    }
  }
  *out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(d);
}

class JsonWriter final {
 public:
  explicit JsonWriter(const JsonDumpOptions& options)
      : options_(options),
        item_separator_(options.item_separator ? *options.item_separator
                        : options.indent       ? ","
                                               : ", ") {}

  Status write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone: out_ += "null"; return Status::ok();
      case Value::Kind::kBool: out_ += v.bool_value() ? "true" : "false"; return Status::ok();
      case Value::Kind::kInt: out_ += std::to_string(v.int_value()); return Status::ok();
      case Value::Kind::kFloat: out_ += json_float(v.float_value()); return Status::ok();
      case Value::Kind::kString:
        append_json_string(v.string_value(), options_.ensure_ascii, &out_);
        return Status::ok();
      case Value::Kind::kArray: return write_array(v.items(), level);
      case Value::Kind::kObject: return write_object(v.object_value(), level);
      default:
        return invalid_argument(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
    }
  }

  std::string take() { return std::move(out_); }

 private:
  void newline(int level) {
    if (!options_.indent) return;
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  Status write_array(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return Status::ok();
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out_ += item_separator_;
      newline(level + 1);
      INFERD_RETURN_IF_ERROR(write(items[i], level + 1));
    }
    newline(level);
    out_ += ']';
    return Status::ok();
  }

  Status write_object(const Object& object, int level) {
    if (object.size() == 0) {
      out_ += "{}";
      return Status::ok();
    }
    std::vector<const std::pair<std::string, Value>*> entries;
    for (const auto& entry : object.entries()) entries.push_back(&entry);
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return a->first < b->first; });
    }
    out_ += '{';
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out_ += item_separator_;
      newline(level + 1);
      append_json_string(entries[i]->first, options_.ensure_ascii, &out_);
      out_ += options_.key_separator;
      INFERD_RETURN_IF_ERROR(write(entries[i]->second, level + 1));
    }
    newline(level);
    out_ += '}';
    return Status::ok();
  }

  const JsonDumpOptions& options_;
  std::string item_separator_;
  std::string out_;
};

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.string_value();
    default: return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.bool_value() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.int_value());
    case Value::Kind::kFloat: return py_float_repr(v.float_value());
    case Value::Kind::kString: return py_repr_string(v.string_value());
    case Value::Kind::kArray: return repr_items(v);
    case Value::Kind::kObject: return repr_object(v.object_value());
    case Value::Kind::kNamespace: return "<Namespace " + repr_object(v.namespace_attributes()) + ">";
    case Value::Kind::kCallable: return "<function " + v.callable_value().name + ">";
  }
  return "";
}

Expected<std::string> to_json(const Value& v, const JsonDumpOptions& options) {
  JsonWriter writer(options);
  INFERD_RETURN_IF_ERROR(writer.write(v, 0));
  return writer.take();
}

std::string py_repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t begin = i;
    const char32_t c = next_code_point(s, &i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c >= kIllFormedBase) {
      append_escape(c - kIllFormedBase, &out);
    } else if (!is_printable(c)) {
      append_escape(c, &out);
    } else {
      out += s.substr(begin, i - begin);
    }
  }
  out += quote;
  return out;
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string_view text(buf, static_cast<size_t>(result.ptr - buf));  // "-d.ddde+XX"
  const size_t e_at = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (char c : text.substr(negative ? 1 : 0, e_at - (negative ? 1 : 0))) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(text.data() + e_at + (text[e_at + 1] == '+' ? 2 : 1), text.data() + text.size(), exponent);
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out.append(digits, 0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1, std::string::npos);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out.append(exp_buf);
  }
  if (exponent < 0) return out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
  const auto int_digits = static_cast<size_t>(exponent + 1);
  if (digits.size() <= int_digits)
    return out.append(digits).append(int_digits - digits.size(), '0').append(".0");
  return out.append(digits, 0, int_digits).append(".").append(digits, int_digits, std::string::npos);
}

}  // namespace inferd::jinja
