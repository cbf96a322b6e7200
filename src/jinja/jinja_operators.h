// Python's operators as jinja2 applies them to template values: arithmetic, comparisons and
// `in`, attribute and item access, slicing. The interpreter calls them per expression node.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "jinja/jinja_ast.h"
#include "jinja/jinja_builtins.h"
#include "jinja/jinja_value.h"

namespace inferd::jinja {

// a + b, a - b, a * b, a / b, a // b, a % b, a ** b (ints stay ints; overflow is an error).
Expected<Value> binary_op(Op op, const Value& a, const Value& b, const BuiltinLimits& limits);
// -a, +a.
Expected<Value> unary_op(Op op, const Value& a);
// ==, !=, <, <=, >, >=, in, not in.
Expected<bool> compare_op(Op op, const Value& a, const Value& b);

// `obj.name`: a method of str/dict, then a dict key or namespace attribute; undefined when
// missing (an error only when obj itself is undefined, as in jinja2).
Expected<Value> get_attribute(const Value& obj, const std::string& name, const BuiltinLimits& limits);
// `obj[key]`: list/str index, dict key, then attribute; undefined when missing.
Expected<Value> get_item(const Value& obj, const Value& key, const BuiltinLimits& limits);
// `obj[start:stop:step]` of a list, tuple or str (absent parts are none).
Expected<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The error of using an undefined value: its hint ("'x' is undefined").
Status undefined_error(const Value& v);
// `s` located at pos ("chat template line L:C: ..."), unless it already names a location.
Status located(const Status& s, SourcePos pos);

}  // namespace inferd::jinja
