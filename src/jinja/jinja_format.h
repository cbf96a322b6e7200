// Text forms of a Value, byte-exact to Python: str() (what `{{ v }}` writes), repr() (how lists
// and dicts print their items) and json.dumps() (the `tojson` filter of transformers).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "jinja/jinja_value.h"

namespace inferd::jinja {

// Python's repr() of a str: quoted with ' (or " when only ' occurs), escapes as CPython writes them.
std::string py_repr_string(std::string_view s);
// Python's repr() of a float: shortest round-trip digits, "1.0", "1e-05", "1e+16", "nan", "inf".
std::string py_float_repr(double v);

// Python's str(v); undefined is "".
std::string to_str(const Value& v);
// Python's repr(v); undefined is "Undefined".
std::string to_repr(const Value& v);

// The arguments of Python's json.dumps that transformers' `tojson` exposes.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;          // none: one line; else newlines, this per level
  std::optional<std::string> item_separator;  // default ", " (one line) or "," (indented)
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(v, ...). Undefined, namespaces and callables are not serializable (an error).
Expected<std::string> to_json(const Value& v, const JsonDumpOptions& options);

}  // namespace inferd::jinja
