// Value: what a chat-template expression evaluates to (Python's None, bool, int, float, str,
// list/tuple, dict, plus Jinja's undefined, namespace() and callables). Built from the request's
// JSON context; the interpreter and its builtins operate on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace inferd::jinja {

class Value;
class Object;
struct Array;
struct Namespace;
struct Callable;
struct CallArgs;

// A builtin or macro body: positional and keyword arguments in, a value or an error out.
using NativeFunction = std::function<Expected<Value>(const CallArgs&)>;

// Hash for unordered maps keyed by std::string that are searched with string_views.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Immutable once built (like every container a sandboxed template sees), except namespaces,
// which `set ns.x = ...` changes in place. Copies share the payload; not thread-safe.
class Value final {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,
    kCallable,
  };

  Value() = default;  // undefined
  // `hint` names what was missing ("'x' is undefined"); it becomes the message when used.
  static Value undefined(std::string hint);
  static Value none();
  static Value from_bool(bool v);
  static Value from_int(int64_t v);
  static Value from_float(double v);
  static Value from_string(std::string v);
  static Value array(std::vector<Value> items, bool is_tuple = false);
  static Value object(Object object);
  static Value new_namespace(Object attributes);
  static Value callable(std::string name, NativeFunction fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool (Python's bool is an int).
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool bool_value() const { return std::get<int64_t>(scalar_) != 0; }
  int64_t int_value() const { return std::get<int64_t>(scalar_); }  // int or bool
  double float_value() const;                                       // any number
  const std::string& string_value() const;                          // string, or undefined's hint
  const std::vector<Value>& items() const;
  bool is_tuple() const;
  const Object& object_value() const;
  Object& namespace_attributes() const;
  const Callable& callable_value() const;

  // Nesting of containers: 0 for scalars, 1 + deepest element otherwise.
  int depth() const;
  // True for namespaces, callables and containers holding one: values that must not be stored
  // in a namespace (no reference cycles).
  bool holds_reference() const;
  // Same namespace or callable object (Python's `is`).
  bool same_object(const Value& other) const;

 private:
  using Payload = std::variant<std::monostate, int64_t, double, std::shared_ptr<const std::string>,
                               std::shared_ptr<const Array>, std::shared_ptr<const Object>,
                               std::shared_ptr<Namespace>, std::shared_ptr<const Callable>>;
  Value(Kind kind, Payload payload) : kind_(kind), scalar_(std::move(payload)) {}

  Kind kind_ = Kind::kUndefined;
  Payload scalar_;
};

// String-keyed map that keeps insertion order, as Python dicts do.
class Object final {
 public:
  const Value* find(std::string_view key) const;
  // Inserts, or replaces the value in place (keeping the key's position).
  void set(std::string key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  // As Value::depth() and Value::holds_reference() of this dict (kept as values are set).
  int depth() const { return depth_; }
  bool holds_reference() const { return holds_reference_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> index_;
  int depth_ = 1;
  bool holds_reference_ = false;
};

struct Array {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;
  bool holds_reference = false;
};

struct Namespace {
  Object attributes;
};

struct Callable {
  std::string name;
  NativeFunction fn;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Python's truth value (undefined is false).
bool truthy(const Value& v);
// Python's == (1 == 1.0 == True; lists and dicts compare by content; undefined equals undefined).
bool equals(const Value& a, const Value& b);
// Python's ordering for <, <=, >, >=: numbers, strings (code points) and lists; anything else is
// the TypeError Python raises. Returns <0, 0, >0.
Expected<int> compare(const Value& a, const Value& b);
// Python's type name, for messages: 'int', 'str', 'list', 'dict', 'NoneType', ...
std::string type_name(const Value& v);

// The value of a JSON document (nlohmann::json or nlohmann::ordered_json); keys keep the
// document's order. Nesting deeper than max_depth is an error.
template <typename Json>
Expected<Value> value_from_json(const Json& json, int max_depth);

}  // namespace inferd::jinja
