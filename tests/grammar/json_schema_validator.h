// A small JSON-schema validator for the tests: the keywords the grammar compiler supports, with
// JSON Schema's meaning (pattern: a search, as the spec says; formats by regex).
#pragma once

#include <cmath>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace inferd::test {

class JsonSchemaValidator final {
 public:
  using Json = nlohmann::ordered_json;
  explicit JsonSchemaValidator(const Json& root) : root_(root) {}

  // Empty when `v` is valid, else why not.
  std::string check(const Json& v) const { return check(root_, v, "$"); }

 private:
  static size_t codepoints(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  static bool has_type(const Json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    return false;
  }

  std::string check(const Json& s, const Json& v, const std::string& at) const {
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("nullable") && s["nullable"].get<bool>() && v.is_null()) return "";
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"].get<std::string>();
      const Json& target = ref == "#" ? root_ : root_.at(Json::json_pointer(ref.substr(1)));
      return check(target, v, at);
    }
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_string()) {
        ok = has_type(v, s["type"].get<std::string>());
      } else {
        for (const Json& t : s["type"]) ok = ok || has_type(v, t.get<std::string>());
      }
      if (!ok) return at + ": not of type " + s["type"].dump();
    }
    if (s.contains("enum")) {
      bool ok = false;
      for (const Json& e : s["enum"]) ok = ok || e == v;
      if (!ok) return at + ": not in enum";
    }
    if (s.contains("const") && s["const"] != v) return at + ": not the const";
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(k)) continue;
      int matched = 0;
      std::string why;
      for (const Json& sub : s[k]) {
        const std::string r = check(sub, v, at);
        if (r.empty()) {
          ++matched;
        } else {
          why = r;
        }
      }
      const std::string key = k;
      if (key == "anyOf" && matched == 0) return at + ": no anyOf matched (" + why + ")";
      if (key == "oneOf" && matched != 1) return at + ": " + std::to_string(matched) + " oneOf matched";
      if (key == "allOf" && matched != static_cast<int>(s[k].size())) return why;
    }
    if (v.is_object()) {
      if (auto r = check_object(s, v, at); !r.empty()) return r;
    }
    if (v.is_array()) {
      if (auto r = check_array(s, v, at); !r.empty()) return r;
    }
    if (v.is_string()) {
      if (auto r = check_string(s, v.get<std::string>(), at); !r.empty()) return r;
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (s.contains("minimum") && x < s["minimum"].get<double>()) return at + ": below minimum";
      if (s.contains("maximum") && x > s["maximum"].get<double>()) return at + ": above maximum";
      if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>())
        return at + ": not above exclusiveMinimum";
      if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>())
        return at + ": not below exclusiveMaximum";
    }
    return "";
  }

  std::string check_object(const Json& s, const Json& v, const std::string& at) const {
    if (s.contains("required")) {
      for (const Json& k : s["required"]) {
        if (!v.contains(k.get<std::string>())) return at + ": missing " + k.get<std::string>();
      }
    }
    std::set<std::string> declared;
    if (s.contains("properties")) {
      for (const auto& [k, sub] : s["properties"].items()) {
        declared.insert(k);
        if (v.contains(k)) {
          if (auto r = check(sub, v[k], at + "." + k); !r.empty()) return r;
        }
      }
    }
    if (s.contains("additionalProperties")) {
      for (const auto& [k, x] : v.items()) {
        if (declared.contains(k)) continue;
        if (auto r = check(s["additionalProperties"], x, at + "." + k); !r.empty()) return r;
      }
    }
    return "";
  }

  std::string check_array(const Json& s, const Json& v, const std::string& at) const {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
    size_t prefix = 0;
    if (s.contains("prefixItems")) {
      prefix = s["prefixItems"].size();
      for (size_t i = 0; i < prefix && i < v.size(); ++i) {
        if (auto r = check(s["prefixItems"][i], v[i], at + "[" + std::to_string(i) + "]"); !r.empty())
          return r;
      }
    }
    if (s.contains("items")) {
      for (size_t i = prefix; i < v.size(); ++i) {
        if (auto r = check(s["items"], v[i], at + "[" + std::to_string(i) + "]"); !r.empty()) return r;
      }
    }
    return "";
  }

  std::string check_string(const Json& s, const std::string& str, const std::string& at) const {
    if (s.contains("minLength") && codepoints(str) < s["minLength"].get<size_t>()) return at + ": too short";
    if (s.contains("maxLength") && codepoints(str) > s["maxLength"].get<size_t>()) return at + ": too long";
    if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) {
      return at + ": does not match the pattern: " + str;
    }
    if (s.contains("format")) {
      static const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
      static const std::string time =
          R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
      const std::string f = s["format"].get<std::string>();
      std::string re;
      if (f == "date") re = date;
      if (f == "time") re = time;
      if (f == "date-time") re = date + "T" + time;
      if (f == "uuid") re = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
      if (f == "email") re = R"([A-Za-z0-9_%+.-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+)";
      if (!std::regex_match(str, std::regex(re))) return at + ": not a " + f + ": " + str;
    }
    return "";
  }

  const Json& root_;
};

}  // namespace inferd::test
