#include "engine/slo.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace inferd {

namespace {

Expected<double> parse_seconds(std::string_view key, std::string_view text) {
  double scale = 1e-3;  // bare numbers are milliseconds
  if (text.size() > 2 && text.substr(text.size() - 2) == "ms") {
    text.remove_suffix(2);
  } else if (text.size() > 1 && text.back() == 's') {
    text.remove_suffix(1);
    scale = 1;
  }
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0)
    return invalid_argument(std::string(key) + " must be a positive duration (e.g. 500ms or 0.5s), got '" +
                            s + "'");
  return v * scale;
}

}  // namespace

Expected<SloClass> parse_slo_class(std::string_view spec) {
  SloClass c;
  const size_t colon = spec.find(':');
  c.name = std::string(spec.substr(0, colon));
  if (c.name.empty() || !std::all_of(c.name.begin(), c.name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
      }))
    return invalid_argument("--slo-class " + std::string(spec) +
                            ": the name must be letters, digits, _ or -");
  std::string_view rest = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return invalid_argument("--slo-class " + std::string(spec) + ": give key=value, not '" +
                              std::string(item) + "'");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "ttft" || key == "tpot") {
      Expected<double> v = parse_seconds(key, value);
      if (!v) return v.status().with_context("--slo-class " + std::string(spec));
      (key == "ttft" ? c.ttft_seconds : c.tpot_seconds) = *v;
    } else if (key == "weight") {
      const std::string s(value);
      char* end = nullptr;
      c.weight = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(c.weight) || c.weight <= 0)
        return invalid_argument("--slo-class " + std::string(spec) + ": weight must be a positive number");
    } else {
      return invalid_argument("--slo-class " + std::string(spec) + ": unknown key '" + std::string(key) +
                              "' (ttft, tpot, weight)");
    }
  }
  return c;
}

Expected<SloClasses> SloClasses::create(std::vector<SloClass> classes, const std::string& default_name) {
  SloClasses out;
  if (classes.empty()) {
    if (!default_name.empty()) return invalid_argument("--slo-default-class needs --slo-class");
    return out;
  }
  for (size_t i = 0; i < classes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (classes[i].name == classes[j].name)
        return invalid_argument("--slo-class: the class '" + classes[i].name + "' is given twice");
    }
  }
  out.classes_ = std::move(classes);
  for (const SloClass& c : out.classes_) {
    int32_t heavier = 0;
    for (const SloClass& o : out.classes_) heavier += o.weight > c.weight ? 1 : 0;
    out.ranks_.push_back(heavier);
  }
  if (default_name.empty()) {
    for (size_t i = 0; i < out.classes_.size(); ++i) {
      if (out.classes_[i].weight <= out.classes_[out.default_].weight) out.default_ = i;
    }
  } else {
    std::optional<size_t> d = out.find(default_name);
    if (!d)
      return invalid_argument("--slo-default-class " + default_name + ": no such class (" + out.names() +
                              ")");
    out.default_ = *d;
  }
  return out;
}

std::optional<size_t> SloClasses::find(std::string_view name) const {
  for (size_t i = 0; i < classes_.size(); ++i) {
    if (classes_[i].name == name) return i;
  }
  return std::nullopt;
}

size_t SloClasses::for_priority(int32_t priority) const {
  const int32_t highest = *std::max_element(ranks_.begin(), ranks_.end());
  const int32_t want = std::clamp(priority, 0, highest);
  // The class of the nearest rank at or below `want` (ranks may skip values when weights tie).
  size_t best = default_;
  int32_t best_rank = -1;
  for (size_t i = 0; i < classes_.size(); ++i) {
    if (ranks_[i] <= want && ranks_[i] > best_rank) {
      best = i;
      best_rank = ranks_[i];
    }
  }
  return best;
}

std::string SloClasses::names() const {
  std::string s;
  for (const SloClass& c : classes_) s += (s.empty() ? "'" : ", '") + c.name + "'";
  return s;
}

}  // namespace inferd
