// SLO classes (`--slo-class name:ttft=...,tpot=...,weight=...`): named latency objectives a
// request opts into. A class's weight ranks it (heavier runs first; classes of equal weight share
// a rank and run earliest deadline first); its TTFT bounds how long a request may wait for its first
// token before the server would rather refuse it (429) than serve it late; TTFT and TPOT together
// decide whether a finished request counts as goodput (DistServe's definition).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace inferd {

struct SloClass {
  std::string name;
  double ttft_seconds = std::numeric_limits<double>::infinity();  // inf: no objective
  double tpot_seconds = std::numeric_limits<double>::infinity();
  double weight = 1;
};

// "name:ttft=500ms,tpot=50ms,weight=4". Durations take ms or s (a bare number is milliseconds,
// as in vLLM's --goodput); every key is optional; the name is [A-Za-z0-9_-]+.
Expected<SloClass> parse_slo_class(std::string_view spec);

// The configured classes. Empty: SLO classes are off (requests keep their plain priority).
class SloClasses final {
 public:
  SloClasses() = default;
  // Checks names are unique; default_name empty: the lightest class (the last declared of equal weight).
  static Expected<SloClasses> create(std::vector<SloClass> classes, const std::string& default_name);

  bool empty() const { return classes_.empty(); }
  size_t size() const { return classes_.size(); }
  const SloClass& at(size_t i) const { return classes_.at(i); }
  const std::vector<SloClass>& classes() const { return classes_; }
  size_t default_index() const { return default_; }
  std::optional<size_t> find(std::string_view name) const;
  // The scheduling rank of class i (its priority value: classes heavier than it).
  int32_t rank(size_t i) const { return ranks_.at(i); }
  // The class of a request that named none but gave `priority` (vLLM's field): the first class
  // of rank min(max(priority, 0), highest rank), or of the nearest lower rank where weights tie.
  size_t for_priority(int32_t priority) const;
  // A request's class: `slo_class` when it names one (an index), else for_priority(priority) for
  // a priority other than 0, else the default class (0 is what a request that gives none has).
  size_t class_of(int32_t slo_class, int32_t priority) const {
    if (slo_class >= 0 && static_cast<size_t>(slo_class) < classes_.size())
      return static_cast<size_t>(slo_class);
    return priority != 0 ? for_priority(priority) : default_;
  }
  // The classes' names, for error messages: 'a', 'b'.
  std::string names() const;

 private:
  std::vector<SloClass> classes_;
  std::vector<int32_t> ranks_;
  size_t default_ = 0;
};

}  // namespace inferd
