#include "jinja/jinja_value.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace inferd::jinja {

namespace {

const std::string kEmpty;

int sign_of(double d) {
  return d < 0 ? -1 : d > 0 ? 1 : 0;
}

}  // namespace

Value Value::undefined(std::string hint) {
  return Value(Kind::kUndefined, std::make_shared<const std::string>(std::move(hint)));
}
Value Value::none() {
  return Value(Kind::kNone, std::monostate{});
}
Value Value::from_bool(bool v) {
  return Value(Kind::kBool, int64_t{v ? 1 : 0});
}
Value Value::from_int(int64_t v) {
  return Value(Kind::kInt, v);
}
Value Value::from_float(double v) {
  return Value(Kind::kFloat, v);
}
Value Value::from_string(std::string v) {
  return Value(Kind::kString, std::make_shared<const std::string>(std::move(v)));
}

Value Value::array(std::vector<Value> items, bool is_tuple) {
  auto a = std::make_shared<Array>();
  for (const Value& item : items) {
    a->depth = std::max(a->depth, 1 + item.depth());
    a->holds_reference = a->holds_reference || item.holds_reference();
  }
  a->items = std::move(items);
  a->is_tuple = is_tuple;
  return Value(Kind::kArray, std::shared_ptr<const Array>(std::move(a)));
}

Value Value::object(Object object) {
  return Value(Kind::kObject, std::make_shared<const Object>(std::move(object)));
}

Value Value::new_namespace(Object attributes) {
  auto ns = std::make_shared<Namespace>();
  ns->attributes = std::move(attributes);
  return Value(Kind::kNamespace, std::move(ns));
}

Value Value::callable(std::string name, NativeFunction fn) {
  return Value(Kind::kCallable, std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
}

double Value::float_value() const {
  if (kind_ == Kind::kFloat) return std::get<double>(scalar_);
  return static_cast<double>(std::get<int64_t>(scalar_));
}

const std::string& Value::string_value() const {
  const auto* s = std::get_if<std::shared_ptr<const std::string>>(&scalar_);
  return s != nullptr ? **s : kEmpty;
}

const std::vector<Value>& Value::items() const {
  return std::get<std::shared_ptr<const Array>>(scalar_)->items;
}
bool Value::is_tuple() const {
  return std::get<std::shared_ptr<const Array>>(scalar_)->is_tuple;
}
const Object& Value::object_value() const {
  return *std::get<std::shared_ptr<const Object>>(scalar_);
}
Object& Value::namespace_attributes() const {
  return std::get<std::shared_ptr<Namespace>>(scalar_)->attributes;
}
const Callable& Value::callable_value() const {
  return *std::get<std::shared_ptr<const Callable>>(scalar_);
}

int Value::depth() const {
  if (kind_ == Kind::kArray) return std::get<std::shared_ptr<const Array>>(scalar_)->depth;
  if (kind_ == Kind::kObject) return object_value().depth();
  return kind_ == Kind::kNamespace ? 1 : 0;
}

bool Value::holds_reference() const {
  if (kind_ == Kind::kNamespace || kind_ == Kind::kCallable) return true;
  if (kind_ == Kind::kArray) return std::get<std::shared_ptr<const Array>>(scalar_)->holds_reference;
  if (kind_ == Kind::kObject) return object_value().holds_reference();
  return false;
}

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  if (kind_ == Kind::kNamespace) {
    return std::get<std::shared_ptr<Namespace>>(scalar_) ==
           std::get<std::shared_ptr<Namespace>>(other.scalar_);
  }
  if (kind_ == Kind::kCallable) {
    return std::get<std::shared_ptr<const Callable>>(scalar_) ==
           std::get<std::shared_ptr<const Callable>>(other.scalar_);
  }
  return false;
}

const Value* Object::find(std::string_view key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Object::set(std::string key, Value value) {
  depth_ = std::max(depth_, 1 + value.depth());
  holds_reference_ = holds_reference_ || value.holds_reference();
  const auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt: return v.int_value() != 0;
    case Value::Kind::kFloat: return v.float_value() != 0.0;
    case Value::Kind::kString: return !v.string_value().empty();
    case Value::Kind::kArray: return !v.items().empty();
    case Value::Kind::kObject: return v.object_value().size() != 0;
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable: return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.float_value() == b.float_value();
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.string_value() == b.string_value();
    case Value::Kind::kArray: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!equals(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kObject: {
      if (a.object_value().size() != b.object_value().size()) return false;
      for (const auto& [key, value] : a.object_value().entries()) {
        const Value* other = b.object_value().find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    default: return a.same_object(b);
  }
}

Expected<int> compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return sign_of(a.float_value() - b.float_value());
    return a.int_value() < b.int_value() ? -1 : a.int_value() > b.int_value() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.string_value().compare(b.string_value());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return invalid_argument(std::string("ordering not supported between instances of '") + type_name(a) +
                          std::string("' and '") + type_name(b) + "'");
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kArray: return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kObject: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
  }
  return "object";
}

template <typename Json>
Expected<Value> value_from_json(const Json& json, int max_depth) {
  using Type = nlohmann::json::value_t;
  switch (json.type()) {
    case Type::null: return Value::none();
    case Type::boolean: return Value::from_bool(json.template get<bool>());
    case Type::number_integer: return Value::from_int(json.template get<int64_t>());
    case Type::number_unsigned: {
      const auto u = json.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::from_int(static_cast<int64_t>(u));
      return Value::from_float(static_cast<double>(u));
    }
    case Type::number_float: return Value::from_float(json.template get<double>());
    case Type::string: return Value::from_string(json.template get_ref<const std::string&>());
    case Type::array:
    case Type::object: {
      if (max_depth <= 0)
        return invalid_argument("chat template context nests lists/objects deeper than max_value_depth");
      if (json.is_array()) {
        std::vector<Value> items;
        items.reserve(json.size());
        for (const auto& element : json) {
          INFERD_ASSIGN_OR_RETURN(Value item, value_from_json(element, max_depth - 1));
          items.push_back(std::move(item));
        }
        return Value::array(std::move(items));
      }
      Object object;
      for (const auto& [key, element] : json.items()) {
        INFERD_ASSIGN_OR_RETURN(Value item, value_from_json(element, max_depth - 1));
        object.set(key, std::move(item));
      }
      return Value::object(std::move(object));
    }
    case Type::binary: return invalid_argument("the context holds binary data, which templates cannot use");
    case Type::discarded: return Value();
  }
  return Value();
}

template Expected<Value> value_from_json<nlohmann::json>(const nlohmann::json&, int);
template Expected<Value> value_from_json<nlohmann::ordered_json>(const nlohmann::ordered_json&, int);

}  // namespace inferd::jinja
