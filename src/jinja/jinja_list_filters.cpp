// jinja2's list filters (first, join, map, select, sort, ...), registered by jinja_filters.cpp.
#include "jinja/jinja_list_filters.h"

#include <algorithm>
#include <cstdlib>

#include "jinja/jinja_format.h"
#include "jinja/jinja_operators.h"
#include "jinja/jinja_strings.h"

namespace inferd::jinja::list_filters {

namespace {

CallArgs tail_args(const CallArgs& args, size_t skip) {
  CallArgs out;
  if (args.positional.size() > skip)
    out.positional.assign(args.positional.begin() + static_cast<long>(skip), args.positional.end());
  return out;
}

// jinja2's attribute getter: "a.b.0" looks up item a, then b, then index 0. With a default,
// a part that is undefined becomes the default (jinja2's map(attribute=..., default=...)).
Expected<Value> attribute_path(const Value& item, const Value& path, const BuiltinLimits& limits,
                               const Value* fallback = nullptr) {
  if (path.is_int()) return get_item(item, path, limits);
  Value current = item;
  for (const std::string& part : py_split(to_str(path), std::string("."), -1)) {
    const bool numeric =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    const Value key = numeric ? Value::from_int(std::atoll(part.c_str())) : Value::from_string(part);
    INFERD_ASSIGN_OR_RETURN(current, get_item(current, key, limits));
    if (fallback != nullptr && current.is_undefined()) current = *fallback;
  }
  return current;
}

// The key sort/unique/min/max compare items by (attribute, case folding).
Expected<Value> sort_key(const Value& item, const Value& attribute, bool case_sensitive,
                         const BuiltinLimits& limits) {
  Value key = item;
  if (!attribute.is_undefined() && !attribute.is_none()) {
    INFERD_ASSIGN_OR_RETURN(key, attribute_path(item, attribute, limits));
  }
  if (!case_sensitive && key.is_string()) return Value::from_string(py_lower(key.string_value()));
  return key;
}

// min / max: the first extreme item by sort key.
Expected<Value> extreme(const Value& in, const CallArgs& args, const BuiltinLimits& limits, bool want_max) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments(want_max ? "max" : "min", args, {"case_sensitive", "attribute"}));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  INFERD_ASSIGN_OR_RETURN(Value best_key, sort_key(items[0], a[1], truthy(a[0]), limits));
  for (size_t i = 1; i < items.size(); ++i) {
    INFERD_ASSIGN_OR_RETURN(Value key, sort_key(items[i], a[1], truthy(a[0]), limits));
    INFERD_ASSIGN_OR_RETURN(int c, compare(key, best_key));
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

// select / reject / selectattr / rejectattr.
Expected<Value> filter_items(const Value& in, const CallArgs& args, const BuiltinLimits& limits,
                             bool keep_passing, bool by_attribute) {
  if (!truthy(in)) return Value::array({});  // jinja2 does not iterate a falsy value
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  const size_t test_at = by_attribute ? 1 : 0;
  if (by_attribute && args.positional.empty())
    return type_error("selectattr/rejectattr need an attribute name");
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      INFERD_ASSIGN_OR_RETURN(subject, attribute_path(item, args.positional[0], limits));
    }
    bool passed = truthy(subject);
    if (args.positional.size() > test_at) {
      INFERD_ASSIGN_OR_RETURN(
          passed, apply_test(to_str(args.positional[test_at]), subject, tail_args(args, test_at + 1)));
    }
    if (passed == keep_passing) out.push_back(item);
  }
  return Value::array(std::move(out));
}

}  // namespace

Expected<Value> dictsort(const Value& in, const CallArgs& args, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments("dictsort", args, {"case_sensitive", "by", "reverse"}));
  if (in.is_undefined()) return undefined_error(in);
  if (!in.is_object()) return type_error("dictsort needs a mapping");
  const bool by_value = to_str(a[1]) == "value";
  std::vector<Value> pairs;
  for (const auto& [key, value] : in.object_value().entries())
    pairs.push_back(Value::array({Value::from_string(key), value}, true));
  Status failure;
  auto key_of = [&](const Value& pair) {
    const Value& k = pair.items()[by_value ? 1 : 0];
    return !truthy(a[0]) && k.is_string() ? Value::from_string(py_lower(k.string_value())) : k;
  };
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    auto c = compare(key_of(x), key_of(y));
    if (!c.has_value()) failure = c.status();
    return c.has_value() && (truthy(a[2]) ? *c > 0 : *c < 0);
  });
  if (!failure.is_ok()) return failure;
  return Value::array(std::move(pairs));
}

Expected<Value> first(const Value& in, const CallArgs&, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Expected<Value> last(const Value& in, const CallArgs&, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Expected<Value> items(const Value& in, const CallArgs&, const BuiltinLimits&) {
  if (in.is_undefined()) return Value::array({});
  if (!in.is_object()) return type_error("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : in.object_value().entries())
    pairs.push_back(Value::array({Value::from_string(key), value}, true));
  return Value::array(std::move(pairs));
}

Expected<Value> join(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("join", args, {"d", "attribute"}));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  const std::string separator = a[0].is_undefined() ? "" : to_str(a[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (!a[1].is_undefined() && !a[1].is_none()) {
      INFERD_ASSIGN_OR_RETURN(item, attribute_path(item, a[1], limits));
    }
    if (i > 0) out += separator;
    out += to_str(item);
    INFERD_RETURN_IF_ERROR(check_string_size(out.size(), limits));
  }
  return Value::from_string(std::move(out));
}

Expected<Value> list(const Value& in, const CallArgs&, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  return Value::array(std::move(items));
}

Expected<Value> map(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  if (!truthy(in)) return Value::array({});  // jinja2 does not iterate a falsy value
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, value] : args.keywords) {
    if (key == "attribute") attribute = &value;
    if (key == "default") fallback = &value;
  }
  if (attribute == nullptr && args.positional.empty())
    return type_error("map() needs a filter name or attribute=");
  std::vector<Value> out;
  for (const Value& item : items) {
    if (attribute != nullptr) {
      const bool has_default = fallback != nullptr && !fallback->is_none();
      INFERD_ASSIGN_OR_RETURN(Value v,
                              attribute_path(item, *attribute, limits, has_default ? fallback : nullptr));
      out.push_back(std::move(v));
    } else {
      const std::string name = to_str(args.positional[0]);
      INFERD_ASSIGN_OR_RETURN(Value v, apply_filter(name, item, tail_args(args, 1), limits));
      out.push_back(std::move(v));
    }
  }
  return Value::array(std::move(out));
}

Expected<Value> max(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  return extreme(in, args, limits, true);
}
Expected<Value> min(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  return extreme(in, args, limits, false);
}

Expected<Value> select(const Value& in, const CallArgs& a, const BuiltinLimits& l) {
  return filter_items(in, a, l, true, false);
}
Expected<Value> reject(const Value& in, const CallArgs& a, const BuiltinLimits& l) {
  return filter_items(in, a, l, false, false);
}
Expected<Value> selectattr(const Value& in, const CallArgs& a, const BuiltinLimits& l) {
  return filter_items(in, a, l, true, true);
}
Expected<Value> rejectattr(const Value& in, const CallArgs& a, const BuiltinLimits& l) {
  return filter_items(in, a, l, false, true);
}

Expected<Value> reverse(const Value& in, const CallArgs&, const BuiltinLimits&) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  std::reverse(items.begin(), items.end());
  if (!in.is_string()) return Value::array(std::move(items));
  std::string out;
  for (const Value& c : items) out += c.string_value();
  return Value::from_string(std::move(out));
}

Expected<Value> sort(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments("sort", args, {"reverse", "case_sensitive", "attribute"}));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    INFERD_ASSIGN_OR_RETURN(Value key, sort_key(item, a[2], truthy(a[1]), limits));
    keyed.emplace_back(std::move(key), item);
  }
  Status failure;
  const bool descending = truthy(a[0]);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    auto c = compare(x.first, y.first);
    if (!c.has_value()) failure = c.status();
    return c.has_value() && (descending ? *c > 0 : *c < 0);
  });
  if (!failure.is_ok()) return failure;
  std::vector<Value> out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::array(std::move(out));
}

Expected<Value> sum(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a, bind_arguments("sum", args, {"attribute", "start"}));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  Value total = a[1].is_undefined() ? Value::from_int(0) : a[1];
  for (const Value& item : items) {
    Value term = item;
    if (!a[0].is_undefined() && !a[0].is_none()) {
      INFERD_ASSIGN_OR_RETURN(term, attribute_path(item, a[0], limits));
    }
    INFERD_ASSIGN_OR_RETURN(total, binary_op(Op::kAdd, total, term, limits));
  }
  return total;
}

Expected<Value> unique(const Value& in, const CallArgs& args, const BuiltinLimits& limits) {
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> a,
                          bind_arguments("unique", args, {"case_sensitive", "attribute"}));
  INFERD_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(in));
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : items) {
    INFERD_ASSIGN_OR_RETURN(Value key, sort_key(item, a[1], truthy(a[0]), limits));
    if ((key.is_array() && !key.is_tuple()) || key.is_object()) {
      return type_error(std::string("unhashable type: '") + type_name(key) + "'");
    }
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::array(std::move(out));
}

}  // namespace inferd::jinja::list_filters
