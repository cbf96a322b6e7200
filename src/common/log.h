// Logging: one process-wide logger (spdlog) writing lines to stderr, as plain text or as one
// JSON object a line. Library code logs through these functions, never through stdio; the CLI
// sets level and format once at start-up (--log-level, --log-format).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace inferd {

enum class LogLevel { kTrace, kDebug, kInfo, kWarning, kError, kOff };
enum class LogFormat { kText, kJson };

// One named value of a structured line (a request's id, its token counts, its timings).
struct LogField {
  std::string name;
  std::variant<int64_t, double, std::string> value;
};

// Sets the level below which lines are dropped and the format of every later line. Call at
// start-up, before other threads log; the default is kInfo, kText.
void configure_logging(LogLevel level, LogFormat format);

// Writes one line, if `level` passes. Text: "inferd: [warning: |error: |debug: ]MESSAGE k=v ...";
// JSON: {"time": ISO 8601, "level": ..., "msg": MESSAGE, NAME: VALUE ...}. Thread-safe.
void log(LogLevel level, std::string_view message, const std::vector<LogField>& fields = {});
inline void log_debug(std::string_view message, const std::vector<LogField>& fields = {}) {
  log(LogLevel::kDebug, message, fields);
}
inline void log_info(std::string_view message, const std::vector<LogField>& fields = {}) {
  log(LogLevel::kInfo, message, fields);
}
inline void log_warning(std::string_view message, const std::vector<LogField>& fields = {}) {
  log(LogLevel::kWarning, message, fields);
}
inline void log_error(std::string_view message, const std::vector<LogField>& fields = {}) {
  log(LogLevel::kError, message, fields);
}

}  // namespace inferd
