#include "router/load_metrics.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace inferd {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// One sample line "name{labels} value [timestamp]": its name and value, if it parses.
bool parse_sample(std::string_view line, std::string_view* name, double* value) {
  size_t end = line.find_first_of("{ \t");
  if (end == std::string_view::npos || end == 0) return false;
  *name = line.substr(0, end);
  if (line[end] == '{') {
    // Label values may hold '}' inside quotes: skip quoted text.
    bool quoted = false;
    size_t i = end + 1;
    for (; i < line.size(); ++i) {
      if (quoted && line[i] == '\\') {
        ++i;
      } else if (line[i] == '"') {
        quoted = !quoted;
      } else if (!quoted && line[i] == '}') {
        break;
      }
    }
    if (i >= line.size()) return false;
    end = i + 1;
  }
  std::string rest(line.substr(end));
  const char* begin = rest.c_str();
  while (*begin == ' ' || *begin == '\t') ++begin;
  char* stop = nullptr;
  *value = std::strtod(begin, &stop);
  return stop != begin;
}

}  // namespace

InstanceLoad parse_load_metrics(std::string_view text) {
  InstanceLoad load;
  size_t at = 0;
  while (at < text.size()) {
    size_t eol = text.find('\n', at);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(at, eol - at);
    at = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    std::string_view name;
    double value = 0;
    if (!parse_sample(line, &name, &value)) continue;
    if (ends_with(name, "num_requests_running")) {
      load.running += value;
      load.found_running = true;
    } else if (ends_with(name, "num_requests_waiting")) {
      load.waiting += value;
      load.found_waiting = true;
    } else if (ends_with(name, "kv_cache_usage_perc") || ends_with(name, "gpu_cache_usage_perc")) {
      load.kv_usage = load.found_kv_usage ? std::max(load.kv_usage, value) : value;
      load.found_kv_usage = true;
    }
  }
  return load;
}

}  // namespace inferd
