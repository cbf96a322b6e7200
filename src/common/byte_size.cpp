#include "common/byte_size.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace inferd {

Expected<int64_t> parse_byte_size(const std::string& text, int64_t available_bytes) {
  const auto fail = [&] {
    return invalid_argument("'" + text +
                            "' is not a memory size (e.g. 2GiB, 512MB, or 0.3 for 30% of free memory)");
  };
  if (text.empty()) return fail();
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(value) || value <= 0) return fail();
  std::string unit(end);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  double bytes;
  if (unit.empty()) {
    if (value <= 1.0) {
      if (available_bytes <= 0)
        return invalid_argument("'" + text + "': free memory is unknown; give a size");
      bytes = value * static_cast<double>(available_bytes);
    } else {
      bytes = value;
    }
  } else {
    static const std::pair<const char*, double> kUnits[] = {
        {"b", 1},           {"kb", 1e3},           {"mb", 1e6}, {"gb", 1e9}, {"kib", 1024.0},
        {"mib", 1048576.0}, {"gib", 1073741824.0}, {"k", 1e3},  {"m", 1e6},  {"g", 1e9}};
    double scale = 0;
    for (const auto& [name, s] : kUnits) {
      if (unit == name) scale = s;
    }
    if (scale == 0) return fail();
    bytes = value * scale;
  }
  if (bytes < 1 || bytes > 9e18) return fail();
  return static_cast<int64_t>(bytes);
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace inferd
