// Builtins of the chat-template interpreter: jinja2's filters and tests, transformers' globals
// (raise_exception, strftime_now, namespace, ...) and the Python str/dict methods templates call.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "jinja/jinja_value.h"

namespace inferd::jinja {

// Budgets a render shares with its builtins.
struct BuiltinLimits {
  int64_t max_string_bytes = 0;  // longest string any operation may build
  int64_t max_items = 0;         // longest list any operation may build (range(), *)
  int max_value_depth = 0;       // deepest nesting of lists and dicts
};

bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);

// `input | name(args)`.
Expected<Value> apply_filter(std::string_view name, const Value& input, const CallArgs& args,
                             const BuiltinLimits& limits);
// `input is name(args)`.
Expected<bool> apply_test(std::string_view name, const Value& input, const CallArgs& args);

// `receiver.name` when it names a str or dict method (a bound callable); nullopt otherwise.
std::optional<Value> find_method(const Value& receiver, std::string_view name, const BuiltinLimits& limits);

// The value of a global name (range, dict, namespace, raise_exception, strftime_now); nullopt
// when there is none.
std::optional<Value> find_global(std::string_view name, const BuiltinLimits& limits);

// Maps call arguments onto a signature (parameter names in order; Python's binding rules).
// Unfilled parameters are undefined. Too many or unknown arguments are an error naming `callee`.
Expected<std::vector<Value>> bind_arguments(std::string_view callee, const CallArgs& args,
                                            std::initializer_list<std::string_view> parameters);

// What iterating `v` yields in Python: list items, a string's characters, a dict's keys; nothing
// for undefined. Other values are not iterable (an error).
Expected<std::vector<Value>> iterate(const Value& v);

// Errors for builtins: the TypeError / ValueError Python would raise.
Status type_error(const std::string& message);
Status check_string_size(size_t bytes, const BuiltinLimits& limits);

}  // namespace inferd::jinja
