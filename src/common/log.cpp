#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

namespace inferd {

namespace {

// The level and format in force, and the logger (spdlog: the level filter, the time stamp of
// JSON lines and one locked write per line).
struct Logging {
  LogFormat format = LogFormat::kText;
  std::shared_ptr<spdlog::logger> logger;
};

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarning: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: break;
  }
  return spdlog::level::off;
}

Logging& logging() {
  static Logging state = [] {
    Logging s;
    // Unbuffered stderr (spdlog's stderr sink flushes every line).
    s.logger = std::make_shared<spdlog::logger>("inferd", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    s.logger->set_pattern("%v");
    s.logger->set_level(spdlog::level::info);
    return s;
  }();
  return state;
}

std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string text_value(const LogField& f) {
  if (const auto* i = std::get_if<int64_t>(&f.value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&f.value)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", *d);
    return buf;
  }
  const auto& s = std::get<std::string>(f.value);
  return s.find_first_of(" \"=") == std::string::npos && !s.empty() ? s : json_string(s);
}

std::string json_value(const LogField& f) {
  if (const auto* s = std::get_if<std::string>(&f.value)) return json_string(*s);
  return text_value(f);
}

const char* text_prefix(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "inferd: trace: ";
    case LogLevel::kDebug: return "inferd: debug: ";
    case LogLevel::kWarning: return "inferd: warning: ";
    case LogLevel::kError: return "inferd: error: ";
    case LogLevel::kInfo:
    case LogLevel::kOff: break;
  }
  return "inferd: ";
}

}  // namespace

void configure_logging(LogLevel level, LogFormat format) {
  Logging& s = logging();
  s.format = format;
  s.logger->set_level(to_spdlog(level));
  // JSON lines carry spdlog's time stamp and level name; the rest of the object is ours.
  s.logger->set_pattern(format == LogFormat::kJson ? R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l",%v})"
                                                   : "%v");
}

void log(LogLevel level, std::string_view message, const std::vector<LogField>& fields) {
  Logging& s = logging();
  const auto spd = to_spdlog(level);
  if (level == LogLevel::kOff || !s.logger->should_log(spd)) return;
  std::string line;
  // Appends only: GCC 12 warns falsely (-Wrestrict, its bug 105651) on `"literal" + std::string`.
  if (s.format == LogFormat::kJson) {
    line.append("\"msg\":").append(json_string(message));
    for (const auto& f : fields)
      line.append(",").append(json_string(f.name)).append(":").append(json_value(f));
  } else {
    line.append(text_prefix(level)).append(message);
    for (const auto& f : fields) line.append(" ").append(f.name).append("=").append(text_value(f));
  }
  s.logger->log(spd, line);
}

}  // namespace inferd
